//! `cargo xtask guest-boxlite`: the BoxLite tests that need a booted box, run for real inside
//! a TCG guest with nested KVM (QEMU `-cpu max` emulates AMD SVM; the guest's `kvm_amd` gives
//! it a `/dev/kvm` of its own that boots libkrun's guests). One boot of Debian 12 backports'
//! 6.12 with 4 GiB, then, as root:
//!
//! - the KVM probe the tests use (`sandbox_boxlite::host::bootable_kvm`) must say "bootable";
//! - `sandbox doctor` with the engine built in: its boot probe must report that guests boot;
//! - the engine tests (`crates/sandbox-boxlite/tests/engine.rs`) with the real box image;
//! - the daemon's and `sandbox exec`'s box tests (`sandbox-cli --test cli -- boxlite::`);
//! - the box benchmark (`benches/boxes.rs`, built in the test profile), against `/bin/true`
//!   in the same guest as the baseline.
//!
//! Every test binary runs with `CI=true`: inside this guest a skip for want of a boot is not
//! allowed, and the run fails on any `skipped:` line that names the boot.
//!
//! The guest runs on single-threaded TCG with `-icount` (see [`ICOUNT`]): its clock counts its
//! own instructions, so BoxLite's fixed 30 s guest-ready bound and every other deadline in the
//! guest measure the guest's work, whatever else the host runs. Each test runs as its own
//! command, with its time on the guest's clock and on the host's in the report.
//!
//! The binaries are built on the host (`--features boxlite`, `BOXLITE_DEPS_STUB=1`) and the
//! workspace (with the runtime files of `cargo xtask boxlite-runtime` and the image of `cargo
//! xtask box-image`) is shared in read-only at its own path, as is a target directory outside
//! it. The guest's scratch work (BoxLite homes, disks) is on its ext4 root (`/var/tmp`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;

use super::{BootOptions, Guest, GuestCommand, Image, Output, Share, User};

/// The kernel the BoxLite suite boots: 6.12 (Debian 12 backports), whose `kvm_amd` runs
/// libkrun's guests under QEMU's emulated SVM.
const SUITE: &str = "bookworm-backports";

/// The guest's clock counts its own instructions (`-icount shift=0`: 1 ns each), so every
/// deadline inside it (BoxLite's fixed 30 s for a booting guest, the tests' and the daemon's
/// bounds) measures the guest's work, not how much of the host's CPU the other processes left
/// it: a loaded build machine runs fewer instructions per second, and the guest's seconds slow
/// down with it. `sleep=on`: while the guest idles (waiting for the host's disk or 9p), its
/// clock follows the host's. `-icount` needs single-threaded TCG (one host thread for both
/// vCPUs).
const ICOUNT: &str = "shift=0,sleep=on";

/// How much longer than a command's guest-side timeout the host waits for it
/// (`Guest::host_wait_factor`): under `-icount` a loaded host runs the guest's seconds up to
/// ~15 times slower than its own.
const HOST_WAIT_FACTOR: u32 = 20;

/// Holds one VM with an irqchip and a vCPU open (KVM_CREATE_VM, KVM_CREATE_IRQCHIP,
/// KVM_CREATE_VCPU), says so in /run/kvm-holder.ready, and sleeps until the guest goes.
const KVM_HOLDER: &str = "import fcntl, os, signal
kvm = os.open(\"/dev/kvm\", os.O_RDWR)
vm = fcntl.ioctl(kvm, 0xAE01, 0)
fcntl.ioctl(vm, 0xAE60, 0)
vcpu = fcntl.ioctl(vm, 0xAE41, 0)
open(\"/run/kvm-holder.ready\", \"w\").write(str(os.getpid()))
signal.pause()";

struct Options {
    /// Only these parts (default: all).
    only: Vec<String>,
    /// A script run as root after the parts (for investigating a failure).
    shell: Vec<String>,
    /// The `cli` part's tests: those whose names contain one of these words (default
    /// `boxlite::`, all).
    cli_filter: String,
}

const PARTS: &[&str] = &["probe", "doctor", "engine", "cli", "bench"];

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options {
        only: Vec::new(),
        shell: Vec::new(),
        cli_filter: "boxlite::".to_string(),
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--only" => {
                let part = rest.next().context("--only needs a part")?;
                ensure!(
                    PARTS.contains(&part.as_str()),
                    "--only {part}: the parts are {}",
                    PARTS.join(", ")
                );
                options.only.push(part.clone());
            }
            "--cli-filter" => {
                let filter = rest.next().context("--cli-filter needs a test name")?;
                ensure!(
                    filter.split(' ').all(|name| {
                        name.starts_with("boxlite::")
                            && name
                                .bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b"_:".contains(&b))
                    }),
                    "--cli-filter {filter}: test names (or parts of them) below boxlite::, \
                     separated by spaces"
                );
                options.cli_filter = filter.clone();
            }
            "--shell" => options
                .shell
                .push(rest.next().context("--shell needs a script")?.clone()),
            other => bail!(
                "unknown argument {other}; usage: cargo xtask guest-boxlite [--only PART]... \
                 [--cli-filter 'boxlite::NAME...'] [--shell SCRIPT]... (parts: {})",
                PARTS.join(", ")
            ),
        }
    }
    Ok(options)
}

/// The host-built executables the guest runs.
struct Binaries {
    sandbox: PathBuf,
    engine: PathBuf,
    cli: PathBuf,
    bench: PathBuf,
    /// Where cargo put them (shared in when it is outside the workspace).
    target_dir: PathBuf,
}

fn build(root: &Path) -> Result<Binaries> {
    eprintln!("guest-boxlite: building the BoxLite tests on the host (--features boxlite)");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .env("BOXLITE_DEPS_STUB", "1")
        .args([
            "test",
            "--locked",
            "-p",
            "sandbox-boxlite",
            "-p",
            "sandbox-cli",
            "--features",
            "sandbox-boxlite/boxlite,sandbox-cli/boxlite",
            "--test",
            "engine",
            "--test",
            "cli",
            "--bench",
            "boxes",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    ensure!(out.status.success(), "cargo test --no-run failed");
    let (mut sandbox, mut engine, mut cli, mut bench) = (None, None, None, None);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let slot = match msg["target"]["name"].as_str() {
            Some("sandbox") => &mut sandbox,
            Some("engine") => &mut engine,
            Some("cli") => &mut cli,
            Some("boxes") => &mut bench,
            _ => continue,
        };
        *slot = Some(PathBuf::from(exe));
    }
    let sandbox: PathBuf = sandbox.context("cargo built no sandbox binary")?;
    // <target>/debug/sandbox
    let target_dir = sandbox
        .parent()
        .and_then(Path::parent)
        .context("the sandbox binary has no target directory")?
        .to_owned();
    Ok(Binaries {
        sandbox,
        engine: engine.context("cargo built no engine test")?,
        cli: cli.context("cargo built no cli test")?,
        bench: bench.context("cargo built no boxes bench")?,
        target_dir,
    })
}

struct Part {
    name: &'static str,
    ok: bool,
    summary: String,
    detail: String,
    /// On the guest's clock (`-icount`: its own instructions, at 1 ns each).
    seconds: f64,
    /// On the host's clock.
    wall: f64,
}

/// `cargo xtask guest-boxlite [--only PART]... [--shell SCRIPT]...`.
pub fn run(args: &[String]) -> Result<bool> {
    let options = parse(args)?;
    let root = crate::nix_check::workspace_root()?;
    let started = Instant::now();
    let runtime = root.join("target/boxlite-runtime");
    let box_image = root.join("target/box-image");
    ensure!(
        runtime.join("boxlite-shim").is_file(),
        "no BoxLite runtime files in {}: run `cargo xtask boxlite-runtime` first",
        runtime.display()
    );
    ensure!(
        box_image.join("oci-layout").is_file(),
        "no box image in {}: run `cargo xtask box-image` first",
        box_image.display()
    );
    let image = Image::ensure(&root)?;
    let kernel = image
        .kernel(SUITE)
        .cloned()
        .with_context(|| format!("the guest image has no {SUITE} kernel"))?;
    let bins = build(&root)?;
    let build_time = started.elapsed();

    // The guest's scratch disk (BoxLite homes, image stores, box disks: gigabytes the root
    // image has no room for): a sparse ext4 file, made here, gone after the run.
    let scratch = root.join("target/guest/boxlite-scratch.ext4");
    make_scratch(&scratch)?;
    let mut boot = BootOptions::new(root.join("target/guest/run-boxlite"));
    boot.memory_mib = 4096;
    boot.accel = "tcg,thread=single".into();
    boot.qemu_args = vec![
        "-icount".into(),
        ICOUNT.into(),
        "-cpu".into(),
        "max".into(),
        "-drive".into(),
        format!(
            "file={},format=raw,if=virtio,cache=unsafe",
            scratch.display()
        ),
    ];

    boot.shares.push(Share {
        host: root.clone(),
        guest: root.clone(),
        read_only: true,
    });
    if !bins.target_dir.starts_with(&root) {
        boot.shares.push(Share {
            host: bins.target_dir.clone(),
            guest: bins.target_dir.clone(),
            read_only: true,
        });
    }
    eprintln!("guest-boxlite: booting {} with -cpu max", kernel.release);
    // Single-threaded TCG boots in a minute on a quiet machine, several on a loaded one.
    boot.boot_timeout = Duration::from_secs(600);
    let mut guest = Guest::boot(&image, &kernel, &boot)?;
    guest.host_wait_factor = HOST_WAIT_FACTOR;
    eprintln!(
        "guest-boxlite: {} up in {:.1} s",
        kernel.release,
        guest.boot_time.as_secs_f64()
    );
    // A VM (with an in-kernel irqchip and one vCPU) held open for the whole session, before
    // any box: KVM flips static keys in the guest kernel (its preempt notifiers, the APIC
    // states) when the first VM or vCPU appears and the last goes, and the kernel patches
    // its own code for each flip. Under multi-threaded TCG that patching races with the
    // other vCPU and the guest panics (`Oops: int3` in finish_task_switch) within minutes of
    // booting boxes. Held, the keys stay on and nothing is patched while boxes come and go.
    // Single-threaded TCG (which `-icount` needs) avoids the race too; the VM stays held so
    // that a run with multi-threaded TCG (`boot.accel`) stays safe, and it costs nothing.
    let kvm = guest.sh(
        User::Root,
        &format!(
            "modprobe kvm_amd 2>&1 && ls -l /dev/kvm && grep -c -w svm /proc/cpuinfo || exit 1
             mkdir -p /scratch && busybox mount -t ext4 /dev/vdb /scratch && chmod 1777 /scratch || exit 1
             (setsid python3 -c '{KVM_HOLDER}' </dev/null >/var/tmp/kvm-holder.log 2>&1 &)
             n=0; while [ ! -e /run/kvm-holder.ready ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done; \
             cat /var/tmp/kvm-holder.log; test -e /run/kvm-holder.ready"
        ),
    )?;
    ensure!(
        kvm.success(),
        "no /dev/kvm in the guest, or no VM held open: {}",
        both(&kvm)
    );

    let env = vec![
        ("CI".to_owned(), "true".to_owned()),
        (
            "SANDBOX_BOXLITE_RUNTIME".to_owned(),
            runtime.display().to_string(),
        ),
        (
            "SANDBOX_TEST_BOX_IMAGE".to_owned(),
            box_image.display().to_string(),
        ),
        // On the scratch disk: BoxLite's disks and homes fit neither a RAM-backed /tmp nor
        // the root image.
        ("TMPDIR".to_owned(), "/scratch".to_owned()),
        ("RUST_BACKTRACE".to_owned(), "1".to_owned()),
        // Importing the image and booting under emulation take minutes, not seconds.
        ("SANDBOX_BOXLITE_READY_TIMEOUT".to_owned(), "300".to_owned()),
    ];
    let wanted = |p: &str| options.only.is_empty() || options.only.iter().any(|o| o == p);
    let mut parts = Vec::new();
    let mut bench_json = None;
    // A part that loses the guest (a panic, a hang) ends the run; the parts before it stand.
    let mut lost = None;
    for name in PARTS.iter().copied().filter(|p| wanted(p)) {
        let part_started = Instant::now();
        let result = match name {
            "probe" => probe(&mut guest, &bins, &env),
            "doctor" => doctor(&mut guest, &bins, &env),
            "engine" => tests(&mut guest, "engine", &bins.engine, "", &env),
            "cli" => tests(&mut guest, "cli", &bins.cli, &options.cli_filter, &env),
            _ => bench(&mut guest, &bins, &env).map(|(part, json)| {
                bench_json = json;
                part
            }),
        };
        match result {
            Ok(mut part) => {
                part.wall = part_started.elapsed().as_secs_f64();
                eprintln!(
                    "guest-boxlite: {} {} in {:.0} s ({:.0} s here): {}",
                    part.name,
                    if part.ok { "passed" } else { "FAILED" },
                    part.seconds,
                    part.wall,
                    part.summary
                );
                parts.push(part)
            }
            Err(err) => {
                parts.push(Part {
                    name,
                    ok: false,
                    summary: "the guest was lost".into(),
                    detail: format!("{err:#}"),
                    seconds: 0.0,
                    wall: part_started.elapsed().as_secs_f64(),
                });
                lost = Some(err);
                break;
            }
        }
    }
    for script in options.shell.iter().filter(|_| lost.is_none()) {
        let mut cmd = GuestCommand::shell(User::Root, script);
        cmd.env = env.clone();
        let out = guest.run(&cmd)?;
        println!(
            "--- shell ({}):\n{}{}",
            out.status_text(),
            out.stdout_text(),
            out.stderr_text()
        );
    }
    let boot_time = guest.boot_time;
    if lost.is_none() {
        guest.poweroff()?;
    } else {
        drop(guest);
    }
    let _ = std::fs::remove_file(&scratch);

    let mut text = String::new();
    let _ = writeln!(
        text,
        "\n{} with nested KVM: boot {:.1} s",
        kernel.release,
        boot_time.as_secs_f64()
    );
    let mut all_ok = true;
    for p in &parts {
        all_ok &= p.ok;
        let _ = writeln!(
            text,
            "  {:<7} {:<4} {:>5.0} s in the guest {:>5.0} s here  {}",
            p.name,
            if p.ok { "PASS" } else { "FAIL" },
            p.seconds,
            p.wall,
            p.summary
        );
        if !p.ok {
            for line in p
                .detail
                .lines()
                .rev()
                .take(80)
                .collect::<Vec<_>>()
                .iter()
                .rev()
            {
                let _ = writeln!(text, "        | {line}");
            }
        }
    }
    let _ = writeln!(
        text,
        "\nguest-boxlite: host build {:.0} s, whole run {:.0} s",
        build_time.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    print!("{text}");
    std::fs::write(
        root.join("target/guest/boxlite-report.json"),
        serde_json::to_string_pretty(&json!({
            "kernel": kernel.release,
            "boot_seconds": boot_time.as_secs_f64(),
            "seconds": started.elapsed().as_secs_f64(),
            "bench": bench_json,
            "parts": parts.iter().map(|p| json!({
                "name": p.name, "ok": p.ok, "summary": p.summary, "seconds": p.seconds,
                "wall_seconds": p.wall,
                "detail": p.detail,
            })).collect::<Vec<_>>(),
        }))?,
    )?;
    Ok(all_ok)
}

fn run_root(
    guest: &mut Guest,
    script: &str,
    env: &[(String, String)],
    timeout: Duration,
) -> Result<Output> {
    let mut cmd = GuestCommand::shell(User::Root, script);
    cmd.env = env.to_vec();
    cmd.timeout = timeout;
    cmd.cwd = Some("/scratch".into());
    guest.run(&cmd)
}

fn both(out: &Output) -> String {
    format!(
        "{}\n{}{}",
        out.status_text(),
        out.stdout_text(),
        out.stderr_text()
    )
}

/// The machine judge the tests use: `doctor --json`'s KVM section must call this guest's KVM
/// bootable (hardware virtualisation behind `/dev/kvm`).
fn probe(guest: &mut Guest, bins: &Binaries, env: &[(String, String)]) -> Result<Part> {
    let out = run_root(
        guest,
        &format!("'{}' doctor --json", bins.sandbox.display()),
        env,
        Duration::from_secs(300),
    )?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let kvm = &doc["boxlite"]["kvmBootable"];
    let ok = kvm["bootable"] == true;
    Ok(Part {
        name: "probe",
        ok,
        summary: kvm["detail"]
            .as_str()
            .unwrap_or("no kvmBootable in doctor --json")
            .to_owned(),
        detail: both(&out),
        seconds: out.seconds,
        wall: 0.0,
    })
}

/// `sandbox doctor`: its boot probe must boot a box here.
fn doctor(guest: &mut Guest, bins: &Binaries, env: &[(String, String)]) -> Result<Part> {
    let out = run_root(
        guest,
        &format!("'{}' doctor", bins.sandbox.display()),
        env,
        Duration::from_secs(300),
    )?;
    let text = out.stdout_text();
    let line = text
        .lines()
        .find(|l| l.contains("guests:"))
        .unwrap_or("")
        .trim()
        .to_owned();
    Ok(Part {
        name: "doctor",
        ok: text.contains("guests: boot here"),
        summary: line,
        detail: both(&out),
        seconds: out.seconds,
        wall: 0.0,
    })
}

/// A test binary, one test per command (each test's time in the report, and a test that hangs
/// is named). It passes when every test passes and none printed `skipped:` (nothing may be
/// skipped in this guest: it boots boxes).
fn tests(
    guest: &mut Guest,
    name: &'static str,
    binary: &Path,
    filter: &str,
    env: &[(String, String)],
) -> Result<Part> {
    let bin = binary.display();
    let list = run_root(
        guest,
        &format!("'{bin}' --list --format terse {filter}"),
        env,
        Duration::from_secs(300),
    )?;
    let names: Vec<String> = list
        .stdout_text()
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect();
    if names.is_empty() {
        return Ok(Part {
            name,
            ok: false,
            summary: format!("no tests listed ({})", list.status_text()),
            detail: both(&list),
            seconds: list.seconds,
            wall: 0.0,
        });
    }
    let (mut passed, mut failed, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    let mut detail = String::new();
    let mut seconds = list.seconds;
    for test in &names {
        let wall = Instant::now();
        // The longest test took 28 s of the guest's clock (minutes of the host's on a
        // loaded machine: the host waits longer, `Guest::host_wait_factor`).
        let out = run_root(
            guest,
            &format!("'{bin}' --exact '{test}' --test-threads=1 2>&1"),
            env,
            Duration::from_secs(300),
        )?;
        seconds += out.seconds;
        let text = out.stdout_text();
        let skips = text.lines().filter(|l| l.contains("skipped:")).count();
        let line = format!(
            "{test}: {} ({:.1} s in the guest, {:.0} s here)",
            out.status_text(),
            out.seconds,
            wall.elapsed().as_secs_f64()
        );
        eprintln!("guest-boxlite:   {line}");
        let _ = writeln!(detail, "{line}");
        if !out.success() {
            failed.push(test.as_str());
            let _ = writeln!(detail, "{text}");
        } else if skips > 0 {
            skipped.push(test.as_str());
            let _ = writeln!(detail, "{text}");
        } else {
            passed.push(test.as_str());
        }
    }
    let mut summary = format!("{} passed", passed.len());
    if !failed.is_empty() {
        let _ = write!(summary, ", {} failed ({})", failed.len(), failed.join(", "));
    }
    if !skipped.is_empty() {
        let _ = write!(
            summary,
            ", {} skipped, none may be here ({})",
            skipped.len(),
            skipped.join(", ")
        );
    }
    Ok(Part {
        name,
        ok: failed.is_empty() && skipped.is_empty(),
        summary,
        detail,
        seconds,
        wall: 0.0,
    })
}

/// The box benchmark, with `/bin/true` run the same way as the same run's baseline.
fn bench(
    guest: &mut Guest,
    bins: &Binaries,
    env: &[(String, String)],
) -> Result<(Part, Option<serde_json::Value>)> {
    let out = run_root(
        guest,
        // Fewer rounds than on hardware: each exec costs a second under emulation.
        &format!("'{}' --json --rounds 11 2>&1", bins.bench.display()),
        env,
        Duration::from_secs(900),
    )?;
    let text = out.stdout_text();
    let json = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.is_object());
    let summary = match &json {
        Some(v) => v.to_string(),
        None => "no JSON line".into(),
    };
    Ok((
        Part {
            name: "bench",
            ok: out.success() && json.is_some(),
            summary,
            detail: text,
            seconds: out.seconds,
            wall: 0.0,
        },
        json,
    ))
}

/// A sparse file of 16 GiB with an empty ext4 file system (only what the guest writes takes
/// room on the host).
fn make_scratch(path: &Path) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let file = std::fs::File::create(path)
        .with_context(|| format!("creating the scratch disk {}", path.display()))?;
    file.set_len(16 << 30)?;
    drop(file);
    let status = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-L", "scratch"])
        .arg(path)
        .status()
        .context("running mke2fs (apt-get install e2fsprogs)")?;
    ensure!(
        status.success(),
        "mke2fs of the scratch disk failed ({status})"
    );
    Ok(())
}
