//! `cargo xtask guest-test`: the native backend's checks in a guest of each Debian kernel,
//! as root and as an unprivileged user, each with the host backend as the control that shows
//! the attack works without a boundary. Reports per kernel (and in
//! `target/guest/report.json`); fails when a check fails.
//!
//! The binaries are built on the host (work in the guest is 4–25× slower) and the workspace is
//! shared in read-only at its own path, so the test executables find what they were built
//! against (`CARGO_BIN_EXE_sandbox`, fixtures under `CARGO_MANIFEST_DIR`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;

use super::{BootOptions, Guest, GuestCommand, Image, Kernel, Output, Share, User};

/// What a kernel is expected to do with the default policy.
struct Expectation {
    /// The default run may refuse (clearly, exit 125, "Nothing was run") instead of running.
    may_refuse: bool,
}

fn expectation(kernel: &Kernel) -> Expectation {
    // Debian 11's 5.10 has no Landlock at all: the run refuses or runs with the layers it has.
    Expectation {
        may_refuse: kernel.suite == "bullseye",
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Pass,
    /// Refused clearly where the kernel may refuse.
    Refused,
    /// Got through, as a reported (not silent) downgrade on this kernel.
    KnownGap,
    Fail,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Refused => "REFUSED",
            Verdict::KnownGap => "GAP",
            Verdict::Fail => "FAIL",
        }
    }
}

struct CheckResult {
    name: &'static str,
    user: User,
    verdict: Verdict,
    summary: String,
    detail: String,
}

struct Options {
    kernels: Vec<String>,
    /// No escape suite at all.
    quick: bool,
    /// The escape suite in every kernel, as root and as the user. By default it runs once, as
    /// the user in Debian 12's 6.1 (the kernel whose degraded paths it must show held or
    /// reported): in an emulated guest one pass takes minutes, and CI has 20 for the matrix.
    full: bool,
    /// The Lima part (`guest/lima.rs`): on by default, `--no-lima` leaves it out, `--lima`
    /// runs it alone.
    lima: bool,
    lima_only: bool,
    /// The limits part ([`limits_part`]): on by default in the 6.12 guest's boot,
    /// `--no-limits` leaves it out, `--limits` runs it alone (one boot of 6.12).
    limits: bool,
    limits_only: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options {
        kernels: Vec::new(),
        quick: false,
        full: false,
        lima: true,
        lima_only: false,
        limits: true,
        limits_only: false,
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--kernel" => options.kernels.push(
                rest.next()
                    .context("--kernel needs a suite (bullseye, bookworm, bookworm-backports)")?
                    .clone(),
            ),
            "--quick" => options.quick = true,
            "--full" => options.full = true,
            "--no-lima" => options.lima = false,
            "--lima" => options.lima_only = true,
            "--no-limits" => options.limits = false,
            "--limits" => options.limits_only = true,
            other => bail!(
                "unknown argument {other}; usage: cargo xtask guest-test [--kernel SUITE]... \
                 [--quick | --full] [--no-lima | --lima] [--no-limits | --limits]"
            ),
        }
    }
    Ok(options)
}

/// The host-built binaries the guest runs.
struct Binaries {
    sandbox: PathBuf,
    escape: PathBuf,
}

fn build_binaries(root: &Path) -> Result<Binaries> {
    eprintln!("guest-test: building the sandbox binary and the escape suite on the host");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args([
            "test",
            "-p",
            "sandbox-cli",
            // The integration tests are one binary (tests/cli); the escape suite is its
            // `escape` module.
            "--test",
            "cli",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    ensure!(out.status.success(), "cargo test --no-run failed");
    let mut sandbox = None;
    let mut escape = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(exe) = msg["executable"].as_str() {
            match msg["target"]["name"].as_str() {
                Some("sandbox") => sandbox = Some(PathBuf::from(exe)),
                Some("cli") => escape = Some(PathBuf::from(exe)),
                _ => {}
            }
        }
    }
    Ok(Binaries {
        sandbox: sandbox.context("cargo built no sandbox binary")?,
        escape: escape.context("cargo built no escape test")?,
    })
}

/// `cargo xtask guest-test [--kernel SUITE]... [--quick]`.
pub fn run(args: &[String]) -> Result<bool> {
    let options = parse(args)?;
    let root = crate::nix_check::workspace_root()?;
    let started = Instant::now();
    let image = Image::ensure(&root)?;
    let image_time = started.elapsed();
    let mut all_ok = true;
    let mut report = Vec::new();
    if (options.lima || options.lima_only) && !options.limits_only {
        all_ok &= lima_part(&root, &image, &mut report)?;
    }
    if options.lima_only {
        return Ok(all_ok);
    }
    let bins = build_binaries(&root)?;
    let kernels: Vec<Kernel> = if options.limits_only {
        vec![image
            .kernel(LIMITS_KERNEL_SUITE)
            .cloned()
            .with_context(|| format!("the image has no kernel of {LIMITS_KERNEL_SUITE}"))?]
    } else if options.kernels.is_empty() {
        image.kernels.clone()
    } else {
        options
            .kernels
            .iter()
            .map(|s| {
                image
                    .kernel(s)
                    .cloned()
                    .with_context(|| format!("the image has no kernel of suite {s}"))
            })
            .collect::<Result<_>>()?
    };

    for kernel in &kernels {
        let mut text = String::new();
        let kernel_started = Instant::now();
        let result = test_kernel(&root, &image, kernel, &bins, &options);
        let elapsed = kernel_started.elapsed();
        match result {
            Ok((boot, checks, bench)) => {
                let what = super::KERNEL_SUITES
                    .iter()
                    .find(|(s, _)| *s == kernel.suite)
                    .map_or("", |(_, w)| *w);
                let _ = writeln!(
                    text,
                    "\n{} ({what}): boot {:.1} s, all checks {:.0} s",
                    kernel.release,
                    boot.as_secs_f64(),
                    elapsed.as_secs_f64()
                );
                for c in &checks {
                    let _ = writeln!(
                        text,
                        "  {:<5} {:<11} {:<8} {}",
                        c.user.name(),
                        c.name,
                        c.verdict.label(),
                        c.summary
                    );
                    if c.verdict == Verdict::Fail {
                        all_ok = false;
                        for line in c.detail.lines().take(40) {
                            let _ = writeln!(text, "        | {line}");
                        }
                    }
                }
                if let Some(b) = &bench {
                    let _ = writeln!(text, "  bench: {b}");
                }
                report.push(json!({
                    "kernel": kernel.release, "suite": kernel.suite,
                    "boot_seconds": boot.as_secs_f64(), "seconds": elapsed.as_secs_f64(),
                    "bench": bench,
                    "checks": checks.iter().map(|c| json!({
                        "name": c.name, "user": c.user.name(), "verdict": c.verdict.label(),
                        "summary": c.summary, "detail": c.detail,
                    })).collect::<Vec<_>>(),
                }));
            }
            Err(err) => {
                all_ok = false;
                let _ = writeln!(text, "\n{}: ERROR {err:#}", kernel.release);
                report.push(json!({"kernel": kernel.release, "error": format!("{err:#}")}));
            }
        }
        // Each kernel's result as soon as it is known.
        print!("{text}");
        std::fs::write(
            root.join("target/guest/report.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "\nguest-test: image {:.0} s, whole matrix {:.0} s",
        image_time.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    print!("{text}");
    Ok(all_ok)
}

/// The Lima part (`guest/lima.rs`), in its kernel: its line, and its entry in the report.
fn lima_part(root: &Path, image: &Image, report: &mut Vec<serde_json::Value>) -> Result<bool> {
    let kernel = image
        .kernel(super::lima::KERNEL_SUITE)
        .with_context(|| format!("the image has no kernel of {}", super::lima::KERNEL_SUITE))?;
    let started = Instant::now();
    let (pass, summary, detail) = match super::lima::run(root, image, kernel) {
        Ok(o) => (o.pass, o.summary, o.detail),
        Err(e) => (false, format!("ERROR {e:#}"), String::new()),
    };
    let mut text = format!(
        "\nlima in {} (virtiofs, the provisioning replayed): {} {summary}\n",
        kernel.release,
        if pass { "PASS" } else { "FAIL" }
    );
    if !pass {
        for line in detail
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            let _ = writeln!(text, "        | {line}");
        }
    }
    print!("{text}");
    report.push(json!({
        "part": "lima", "kernel": kernel.release, "seconds": started.elapsed().as_secs_f64(),
        "verdict": if pass { "PASS" } else { "FAIL" }, "summary": summary, "detail": detail,
    }));
    std::fs::write(
        root.join("target/guest/report.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    Ok(pass)
}

fn test_kernel(
    root: &Path,
    image: &Image,
    kernel: &Kernel,
    bins: &Binaries,
    options: &Options,
) -> Result<(Duration, Vec<CheckResult>, Option<serde_json::Value>)> {
    let mut boot = BootOptions::new(root.join(format!("target/guest/run-{}", kernel.suite)));
    boot.shares.push(Share {
        host: root.to_owned(),
        guest: root.to_owned(),
        read_only: true,
    });
    eprintln!("guest-test: booting {} ({})", kernel.release, kernel.suite);
    let mut guest = Guest::boot(image, kernel, &boot)?;
    let boot_time = guest.boot_time;
    eprintln!(
        "guest-test: {} up in {:.1} s",
        guest.kernel.release,
        boot_time.as_secs_f64()
    );
    let expect = expectation(kernel);
    let mut checks = Vec::new();
    let limits = kernel.suite == LIMITS_KERNEL_SUITE && (options.limits || options.limits_only);
    if options.limits_only {
        checks.extend(limits_part(&mut guest, bins)?);
        guest.poweroff()?;
        return Ok((boot_time, checks, None));
    }
    for user in [User::Root, User::User] {
        checks.push(doctor(&mut guest, bins, user)?);
        checks.push(readme(&mut guest, bins, user, &expect)?);
        checks.push(quarantine(&mut guest, bins, user, &expect)?);
        if user == User::Root {
            checks.push(signal_init(&mut guest, bins, &expect)?);
        }
        let escape = options.full || (kernel.suite == "bookworm" && user == User::User);
        if escape && !options.quick {
            checks.push(escape_suite(&mut guest, bins, user)?);
        }
    }
    let bench = bench(&mut guest, bins).ok();
    // Last: it mounts cgroup2 and enables controllers, which the checks above run without.
    if limits {
        checks.extend(limits_part(&mut guest, bins)?);
    }
    guest.poweroff()?;
    Ok((boot_time, checks, bench))
}

fn with_bin(bins: &Binaries, script: &str) -> String {
    format!("BIN='{}'\n{script}", bins.sandbox.display())
}

fn detail(out: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        out.status_text(),
        out.stdout_text(),
        out.stderr_text()
    )
}

/// The run refused clearly: exit 125 and the refusal's words.
fn refused_clearly(out: &str) -> bool {
    out.contains("exit=125") && out.contains("Nothing was run")
}

fn doctor(guest: &mut Guest, bins: &Binaries, user: User) -> Result<CheckResult> {
    let out = guest.sh(user, &with_bin(bins, "cd ~ && \"$BIN\" doctor"))?;
    let first = out
        .stdout_text()
        .lines()
        .find(|l| l.to_lowercase().contains("landlock"))
        .unwrap_or("")
        .trim()
        .to_owned();
    Ok(CheckResult {
        name: "doctor",
        user,
        verdict: if out.success() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        summary: first,
        detail: detail(&out),
    })
}

/// The README's first command: the attack is `touch ~/escaped`.
fn readme(
    guest: &mut Guest,
    bins: &Binaries,
    user: User,
    expect: &Expectation,
) -> Result<CheckResult> {
    let script = |backend: &str| {
        with_bin(
            bins,
            &format!(
                r#"cd ~; rm -f ~/escaped; d=$(mktemp -d)
"$BIN" run {backend} -C "$d" -- sh -c 'echo hello from $SANDBOX_BACKEND | tee note.txt; touch ~/escaped' 2>&1
echo "exit=$?"
[ -f "$d/note.txt" ] && echo note-written
[ -e ~/escaped ] && echo ESCAPED; rm -f ~/escaped; true"#
            ),
        )
    };
    let control = guest.sh(user, &script("--backend host"))?;
    let out = guest.sh(user, &script(""))?;
    let (c, o) = (control.stdout_text(), out.stdout_text());
    let control_ok = c.contains("ESCAPED");
    let (verdict, summary) = if !control_ok {
        (
            Verdict::Fail,
            "control: the host backend did not create ~/escaped".into(),
        )
    } else if o.contains("hello from native")
        && o.contains("note-written")
        && !o.contains("ESCAPED")
    {
        (
            Verdict::Pass,
            "ran; note.txt written, ~/escaped not created (control: created)".into(),
        )
    } else if refused_clearly(&o) && expect.may_refuse {
        (Verdict::Refused, first_line_with(&o, "cannot enforce"))
    } else if o.contains("ESCAPED") {
        (Verdict::Fail, "~/escaped was created".into())
    } else {
        (Verdict::Fail, first_line_with(&o, "exit="))
    };
    Ok(CheckResult {
        name: "readme",
        user,
        verdict,
        summary,
        detail: format!("{o}\n--- control\n{c}"),
    })
}

fn first_line_with(text: &str, needle: &str) -> String {
    text.lines()
        .find(|l| l.contains(needle))
        .or_else(|| text.lines().next())
        .unwrap_or("")
        .chars()
        .take(160)
        .collect()
}

/// A linked worktree's run: its commit lands on its branch, its move of `main` does not.
fn quarantine(
    guest: &mut Guest,
    bins: &Binaries,
    user: User,
    expect: &Expectation,
) -> Result<CheckResult> {
    let script = |backend: &str| {
        with_bin(
            bins,
            &format!(
                r#"set -u; export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t
r=$(mktemp -d ~/q.XXXX); cd "$r" && git init -q -b main repo && cd repo &&
git commit -q --allow-empty -m base && git worktree add -q ../task -b task || exit 99
base=$(git rev-parse main)
"$BIN" run {backend} -C ../task -- sh -c 'git commit -q --allow-empty -m inside && git update-ref refs/heads/main HEAD' 2>&1
echo "exit=$?"
[ "$(git rev-parse task)" != "$base" ] && echo task-moved
[ "$(git rev-parse main)" != "$base" ] && echo MAIN-MOVED; true"#
            ),
        )
    };
    let control = guest.sh(user, &script("--backend host"))?;
    let out = guest.sh(user, &script(""))?;
    let (c, o) = (control.stdout_text(), out.stdout_text());
    let (verdict, summary) = if !c.contains("MAIN-MOVED") {
        (
            Verdict::Fail,
            "control: the host backend did not move main".into(),
        )
    } else if o.contains("task-moved") && !o.contains("MAIN-MOVED") {
        (
            Verdict::Pass,
            "commit landed on task, main unchanged (control: moved)".into(),
        )
    } else if refused_clearly(&o) && expect.may_refuse {
        (Verdict::Refused, first_line_with(&o, "cannot enforce"))
    } else if o.contains("MAIN-MOVED") {
        (Verdict::Fail, "main moved".into())
    } else {
        (Verdict::Fail, first_line_with(&o, "quarantine"))
    };
    Ok(CheckResult {
        name: "quarantine",
        user,
        verdict,
        summary,
        detail: format!("{o}\n--- control\n{c}"),
    })
}

/// As root, signal a process of the guest outside the sandbox (a sleeper the check starts; its
/// pid is the host's, which a pid namespace does not even name): held, or a reported gap, never
/// silent. The check keeps its first name, `signal-init`: pid 1 inside is now the run's own init.
fn signal_init(guest: &mut Guest, bins: &Binaries, expect: &Expectation) -> Result<CheckResult> {
    let script = |backend: &str| {
        with_bin(
            bins,
            &format!(
                r#"cd ~; d=$(mktemp -d)
sleep 600 </dev/null >/dev/null 2>&1 & victim=$!
"$BIN" run {backend} -C "$d" -- sh -c "kill -0 $victim && echo SIGNALLED" 2>&1
echo "exit=$?"; kill $victim"#
            ),
        )
    };
    let control = guest.sh(User::Root, &script("--backend host"))?;
    let out = guest.sh(User::Root, &script(""))?;
    let (c, o) = (control.stdout_text(), out.stdout_text());
    let (verdict, summary) = if !c.contains("SIGNALLED") {
        (
            Verdict::Fail,
            "control: the host backend could not signal the host process".into(),
        )
    } else if !o.contains("SIGNALLED") && o.contains("exit=") && !refused_clearly(&o) {
        (
            Verdict::Pass,
            "kill -0 of a host process refused inside (control: allowed)".into(),
        )
    } else if refused_clearly(&o) && expect.may_refuse {
        (Verdict::Refused, first_line_with(&o, "cannot enforce"))
    } else if o.contains("SIGNALLED") && o.to_lowercase().contains("signal") {
        // The run said it could not scope signals (a degraded run the user asked for).
        (Verdict::KnownGap, first_line_with(&o, "signal"))
    } else {
        (Verdict::Fail, "init signalled, silently".into())
    };
    Ok(CheckResult {
        name: "signal-init",
        user: User::Root,
        verdict,
        summary,
        detail: format!("{o}\n--- control\n{c}"),
    })
}

/// The escape suite (native, with host as the control), from the host-built test executable.
fn escape_suite(guest: &mut Guest, bins: &Binaries, user: User) -> Result<CheckResult> {
    let mut cmd = GuestCommand::shell(
        user,
        &format!(
            "cd ~ && '{}' --test-threads=1 escape::backends_hold_against_the_escape_suite --nocapture 2>&1",
            bins.escape.display()
        ),
    );
    cmd.env
        .push(("SANDBOX_ESCAPE_BACKENDS".into(), "host,native".into()));
    // The suite's homes, runtime and state directories go under TMPDIR. On disk, as Debian
    // 12's /tmp is: on the guest's tmpfs /tmp before Linux 6.6 no place would take the
    // quarantine's layers, and every git run is refused (clearly, but then the suite proves
    // nothing else).
    cmd.env.push(("TMPDIR".into(), "/var/tmp".into()));
    cmd.timeout = Duration::from_secs(1800);
    let out = guest.run(&cmd)?;
    let o = out.stdout_text();
    let summary = format!(
        "{} in {:.0} s: {}",
        out.status_text(),
        out.seconds,
        first_line_with(&o, "test result:")
    );
    Ok(CheckResult {
        name: "escape",
        user,
        verdict: if out.success() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        summary,
        detail: o.lines().rev().take(60).collect::<Vec<_>>().join("\n"),
    })
}

/// `sandbox run -- /bin/true` against `/bin/true`, medians, as the user, in the guest.
fn bench(guest: &mut Guest, bins: &Binaries) -> Result<serde_json::Value> {
    let script = format!(
        r#"import json, statistics, subprocess, tempfile, time
d = tempfile.mkdtemp()
def median(argv, n):
    xs, code = [], None
    for _ in range(n):
        s = time.perf_counter()
        code = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        xs.append(time.perf_counter() - s)
    return statistics.median(xs), code
t, _ = median(["/bin/true"], 21)
r, code = median(["{}", "run", "-C", d, "--", "/bin/true"], 11)
print(json.dumps({{"true_ms": t * 1e3, "run_ms": r * 1e3, "ratio": r / t, "run_exit": code}}))"#,
        bins.sandbox.display()
    );
    let out = guest.run(&GuestCommand {
        argv: vec!["python3".into(), "-c".into(), script],
        user: User::User,
        env: Vec::new(),
        cwd: None,
        timeout: Duration::from_secs(600),
    })?;
    ensure!(out.success(), "bench failed: {}", detail(&out));
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The kernel whose boot carries the limits part: Debian 12 backports' 6.12, the newest
/// (`memory.peak`, `pids.peak`), as a systemd-based desktop of today has it.
const LIMITS_KERNEL_SUITE: &str = "bookworm-backports";

const LIMITS_SCRIPT: &str = include_str!("limits.py");

/// The group the limits part delegates to `user`, as systemd's system manager delegates
/// `user@1000.service` to the user's manager.
const DELEGATED: &str = "/sys/fs/cgroup/user.slice/user@1000.service";

/// The resource limits on a real cgroup v2 hierarchy (`limits.py`), as root in the root group
/// and as `user` in a group delegated to it the way systemd does it: cgroup2 mounted (the
/// guest's init mounts none), memory, pids and cpu enabled for the groups below the root and
/// `user.slice`, `user@1000.service` chowned to the user (the directory and its
/// `cgroup.procs`, `cgroup.subtree_control`, `cgroup.threads`), the controllers enabled below
/// it and a leaf `session.scope` made by the user, as its manager would, and the user's
/// process moved into that leaf. Each `sandbox` the user starts gets a scope of its own, as
/// `systemd-run --user --scope -p Delegate=yes` gives it.
fn limits_part(guest: &mut Guest, bins: &Binaries) -> Result<Vec<CheckResult>> {
    let setup = format!(
        r#"set -eu
cg=/sys/fs/cgroup; d='{DELEGATED}'
grep -q "^[^ ]* $cg cgroup2 " /proc/mounts || busybox mount -t cgroup2 cgroup2 $cg
echo '+memory +pids +cpu' > $cg/cgroup.subtree_control
mkdir -p $cg/user.slice "$d"
echo '+memory +pids +cpu' > $cg/user.slice/cgroup.subtree_control
chown 1000:1000 "$d" "$d/cgroup.procs" "$d/cgroup.subtree_control" "$d/cgroup.threads"
setpriv --reuid=1000 --regid=1000 --clear-groups sh -c \
  "echo '+memory +pids +cpu' > '$d/cgroup.subtree_control' && mkdir -p '$d/session.scope'"
echo "delegated: $(cat "$d/cgroup.controllers") ($(stat -c %U "$d/session.scope/cgroup.procs"))""#
    );
    let out = guest.sh(User::Root, &setup)?;
    if !out.success() {
        return Ok(vec![CheckResult {
            name: "limits",
            user: User::Root,
            verdict: Verdict::Fail,
            summary: "setting up the cgroup v2 hierarchy failed".into(),
            detail: detail(&out),
        }]);
    }
    let bin = bins.sandbox.display().to_string();
    let mut checks = Vec::new();
    let as_root = GuestCommand {
        argv: vec![
            "python3".into(),
            "-c".into(),
            LIMITS_SCRIPT.into(),
            bin.clone(),
            "root".into(),
        ],
        user: User::Root,
        env: Vec::new(),
        cwd: None,
        timeout: Duration::from_secs(1800),
    };
    // Started by the agent as root, moved into the user's leaf, then the user's own.
    let wrapper = r#"d=$1; shift; echo $$ > "$d/session.scope/cgroup.procs" &&
exec setpriv --reuid=1000 --regid=1000 --clear-groups env HOME=/home/user USER=user \
  LOGNAME=user XDG_RUNTIME_DIR=/run/user/1000 "$@""#;
    let as_user = GuestCommand {
        argv: vec![
            "bash".into(),
            "-c".into(),
            wrapper.into(),
            "bash".into(),
            DELEGATED.into(),
            "python3".into(),
            "-c".into(),
            LIMITS_SCRIPT.into(),
            bin,
            "user".into(),
            DELEGATED.into(),
        ],
        ..as_root.clone()
    };
    for (user, command) in [(User::Root, as_root), (User::User, as_user)] {
        let out = guest.run(&command)?;
        let mut any = false;
        for line in out.stdout_text().lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            any = true;
            let name = match v["check"].as_str().unwrap_or("") {
                "pids" => "limits-pids",
                "memory" => "limits-mem",
                "cpu" => "limits-cpu",
                "killed" => "limits-kill",
                "no-scope" => "limits-noscope",
                _ => "limits",
            };
            checks.push(CheckResult {
                name,
                user,
                verdict: if v["ok"] == true {
                    Verdict::Pass
                } else {
                    Verdict::Fail
                },
                summary: v["summary"].as_str().unwrap_or("").to_owned(),
                detail: v["detail"].as_str().unwrap_or("").to_owned(),
            });
        }
        if !any || !out.success() {
            checks.push(CheckResult {
                name: "limits",
                user,
                verdict: Verdict::Fail,
                summary: format!("limits.py: {}", out.status_text()),
                detail: detail(&out),
            });
        }
    }
    Ok(checks)
}
