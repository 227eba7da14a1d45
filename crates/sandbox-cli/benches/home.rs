//! The private home's cost: the start-up a run pays for its home, toolchains and cache
//! overlays, and a `cargo build` inside (rustup read-only, the registry an overlay) against the
//! same build on the host.
//!
//! `cargo bench -p sandbox-cli --bench home` (`--profile dev` on a loaded machine: the
//! bench profile's fat-LTO build of the CLI takes long). `SANDBOX_BENCH_RUNS` (default 30)
//! sets the start-up sample, `SANDBOX_BENCH_BUILDS` (default 2) the builds of each side.
//!
//! The "user" is a temporary home with caches of its own; the toolchain is the machine's
//! rustup. The build is a crate depending on `serde_json` and `regex` (14 crates), fetched
//! into that user's cache on the host first, so neither side downloads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox");

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct User {
    root: PathBuf,
    rustup: PathBuf,
    bin: PathBuf,
}

impl User {
    fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    fn cmd(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env(
                "PATH",
                format!("{}:/usr/local/bin:/usr/bin:/bin", self.bin.display()),
            )
            .env("RUSTUP_HOME", &self.rustup)
            .env("HOME", self.home())
            .env("XDG_CONFIG_HOME", self.home().join(".config"))
            .env("XDG_STATE_HOME", self.home().join(".local/state"))
            .env("XDG_RUNTIME_DIR", self.root.join("run"))
            .env("CARGO_TERM_COLOR", "never")
            .stdin(Stdio::null());
        cmd
    }

    fn config(&self, text: &str) {
        let dir = self.home().join(".config/sandbox");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.yaml"), text).unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn timed(mut cmd: Command) -> Duration {
    let start = Instant::now();
    let out = cmd.output().unwrap();
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// Wall time and the CPU time (user + system) of the child and everything it waited for.
// The child is reaped by wait4(2), which also gives its resource usage.
#[allow(clippy::zombie_processes)]
fn timed_cpu(mut cmd: Command) -> (Duration, Duration) {
    let start = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut status = 0;
    // SAFETY: `rusage` is plain integers; all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4(2) on our own child, writing its status and usage into our locals.
    let rc = unsafe { libc::wait4(pid.as_raw(), &mut status, 0, &mut usage) };
    let took = start.elapsed();
    assert!(rc == pid.as_raw() && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (took, tv(usage.ru_utime) + tv(usage.ru_stime))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let real_home = PathBuf::from(std::env::var_os("HOME").unwrap());
    let rustup = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home.join(".rustup"));
    let bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home.join(".cargo"))
        .join("bin");
    if !bin.join("cargo").is_file() {
        println!("skipped: no rustup toolchain on this machine");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("sandbox-bench-home-")
        .tempdir()
        .unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let user = User { root, rustup, bin };
    for d in [".config", ".local/state", ".npm", ".cache/pip"] {
        std::fs::create_dir_all(user.home().join(d)).unwrap();
    }
    std::fs::create_dir_all(user.root.join("run")).unwrap();
    let main = user.root.join("main");
    std::fs::create_dir_all(&main).unwrap();
    let task = user.root.join("task");
    sandbox_testkit::linked_worktree(&main, &task);
    std::fs::create_dir_all(task.join("src")).unwrap();
    std::fs::write(
        task.join("Cargo.toml"),
        "[package]\nname = \"mid\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nserde_json = \"=1.0.133\"\nregex = \"=1.11.1\"\n",
    )
    .unwrap();
    std::fs::write(
        task.join("src/main.rs"),
        "fn main() { let r = regex::Regex::new(\"a+\").unwrap(); \
         println!(\"{}\", serde_json::json!({\"m\": r.is_match(\"aa\")})); }\n",
    )
    .unwrap();
    // The user's cache gets the sources, on the host.
    let mut fetch = user.cmd(&user.bin.join("cargo"));
    fetch.arg("fetch").current_dir(&task);
    timed(fetch);

    // Start-up: `sandbox run -- true` with the home off, with the home and toolchains but no
    // cache layers, and with everything (the rust toolchain; three cache overlays: cargo
    // registry, npm, pip), interleaved. Wall time and the CPU time of the whole process tree.
    let runs = env_num("SANDBOX_BENCH_RUNS", 30);
    let configs = [
        ("home off", "home: off\n"),
        ("home + toolchains, no caches", "caches: false\n"),
        ("home + toolchains + 3 caches", ""),
    ];
    let mut wall: Vec<Vec<Duration>> = vec![Vec::new(); configs.len()];
    let mut cpu: Vec<Vec<Duration>> = vec![Vec::new(); configs.len()];
    for i in 0..runs + 3 {
        for (k, (_, config)) in configs.iter().enumerate() {
            user.config(config);
            let mut cmd = user.cmd(Path::new(BIN));
            cmd.args(["run", "--", "true"]).current_dir(&task);
            let (took, used) = timed_cpu(cmd);
            if i >= 3 {
                wall[k].push(took);
                cpu[k].push(used);
            }
        }
    }
    user.config("");
    let mut show = user.cmd(Path::new(BIN));
    show.args(["policy", "show"]).current_dir(&task);
    let shown = String::from_utf8_lossy(&show.output().unwrap().stdout).into_owned();
    let caches = shown
        .lines()
        .find(|l| l.starts_with("caches"))
        .unwrap_or("")
        .to_string();
    println!("start-up of `sandbox run -- true`, {runs} runs each, median (wall / CPU):");
    let base = (median(wall[0].clone()), median(cpu[0].clone()));
    for (k, (name, _)) in configs.iter().enumerate() {
        let (w, c) = (median(wall[k].clone()), median(cpu[k].clone()));
        println!(
            "  {name:<30} {:8.2} ms / {:6.2} ms   added {:+7.2} ms / {:+6.2} ms",
            ms(w),
            ms(c),
            ms(w) - ms(base.0),
            ms(c) - ms(base.1)
        );
    }
    println!("  ({})", caches.trim());

    // The build: inside (target in the worktree) against the host (a target dir of its own),
    // clean each time, alternating.
    let builds = env_num("SANDBOX_BENCH_BUILDS", 2);
    let (mut host, mut inside) = (Vec::new(), Vec::new());
    for _ in 0..builds {
        let host_target = user.root.join("host-target");
        let _ = std::fs::remove_dir_all(&host_target);
        let mut cmd = user.cmd(&user.bin.join("cargo"));
        cmd.args(["build", "--offline", "-q"])
            .env("CARGO_TARGET_DIR", &host_target)
            .current_dir(&task);
        host.push(timed(cmd));
        let _ = std::fs::remove_dir_all(task.join("target"));
        let mut cmd = user.cmd(Path::new(BIN));
        cmd.args(["run", "--", "cargo", "build", "--offline", "-q"])
            .current_dir(&task);
        inside.push(timed(cmd));
    }
    let (h, s) = (median(host.clone()), median(inside.clone()));
    println!("cargo build (serde_json + regex, debug, clean), {builds} each:");
    println!(
        "  host                             {:8.2} s   {:?}",
        h.as_secs_f64(),
        host.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>()
    );
    println!(
        "  sandbox run (overlay registry)   {:8.2} s   {:?}",
        s.as_secs_f64(),
        inside.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>()
    );
    println!(
        "  ratio                            {:8.3}",
        s.as_secs_f64() / h.as_secs_f64()
    );
}
