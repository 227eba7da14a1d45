//! BoxLite boxes: create, boot, warm exec and reuse by name, against the real runtime.
//!
//! `BOXLITE_DEPS_STUB=1 cargo bench -p sandbox-boxlite --features boxlite --bench boxes`
//! (`--profile release` or `--profile dev` where the `bench` profile's fat LTO of BoxLite's
//! dependency tree takes too long; the engine's time is in the guest and the shim, not here)
//! (after `cargo xtask boxlite-runtime`). Targets on hardware KVM (BENCHMARKS.md): reuse by name
//! < 200 ms, warm exec < 25 ms. Steps that need a booted guest print `skipped: <reason>`
//! where this machine's KVM cannot boot guests (this build machine's kvm-pvm); `cargo xtask
//! guest-boxlite` runs it inside a TCG guest with nested KVM, where they run. Needs the box
//! image (`cargo xtask box-image`). The baseline, measured in the same run: `/bin/true`
//! spawned directly on the machine that runs the boxes. `--json`: one JSON line at the end.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(not(feature = "boxlite"))]
fn main() {
    println!("skipped: built without the `boxlite` feature");
}

#[cfg(feature = "boxlite")]
fn main() {
    use std::time::{Duration, Instant};

    use sandbox_boxlite::boxlite::BoxCommand;
    use sandbox_boxlite::engine::{Engine, EngineOptions};
    use sandbox_boxlite::{layout, BoxSpec, ImageSource};

    fn median(mut v: Vec<Duration>) -> Duration {
        v.sort();
        v[v.len() / 2]
    }
    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }

    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().any(|a| a == "--json");
    // `--rounds N`: how many times each repeated step runs (default 50).
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(50);
    let mut report = serde_json::Map::new();
    let mut put = |key: &str, d: Duration, what: &str| {
        println!("{what}: {:.2} ms", ms(d));
        report.insert(key.into(), serde_json::json!(ms(d)));
    };
    let dir = tempfile::tempdir().unwrap();
    let image = layout::test_box_image()
        .expect("the box image: run `cargo xtask box-image` or set SANDBOX_TEST_BOX_IMAGE");
    // The baseline: a process spawned here, directly.
    let mut spawn = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        std::process::Command::new("/bin/true").status().unwrap();
        spawn.push(t.elapsed());
    }
    let spawn = median(spawn);
    put(
        "spawn_true_ms",
        spawn,
        "baseline: /bin/true spawned here, median of 21",
    );
    let kvm = sandbox_boxlite::host::kvm_bootable(std::path::Path::new("/dev/kvm"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut booted = false;
    rt.block_on(async {
        let t = Instant::now();
        let engine = Engine::open(EngineOptions::new(dir.path().join("home"))).unwrap();
        put("open_ms", t.elapsed(), "open runtime (lock, checks, store)");
        let spec = BoxSpec {
            name: "bench".into(),
            image: ImageSource::Layout(image),
            cpus: Some(1),
            memory_mib: Some(512),
            disk_size_gb: None,
            mounts: vec![],
            share: None,
            allow_net: vec![],
            block_net: true,
            env: Default::default(),
            workdir: None,
        };
        let t = Instant::now();
        let (b, created) = engine.create(&spec).await.unwrap();
        assert!(created);
        put("create_ms", t.elapsed(), "create (new name, before boot)");
        let mut reuse = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            let (_, created) = engine.create(&spec).await.unwrap();
            assert!(!created);
            reuse.push(t.elapsed());
        }
        put(
            "reuse_stopped_ms",
            median(reuse),
            "reuse by name (box not running), median",
        );
        let t = Instant::now();
        match engine.start("bench", &b).await {
            Err(e) if !kvm.bootable => {
                println!("first start failed after {:.0} ms", ms(t.elapsed()));
                println!(
                    "skipped: boot, exec and reuse of a running box ({}): {e}",
                    kvm.detail
                );
            }
            Err(e) => panic!(
                "guests boot here ({}), but the box did not: {e}",
                kvm.detail
            ),
            Ok(boot) => {
                booted = true;
                put(
                    "first_start_ms",
                    t.elapsed(),
                    "first start (import, disks, shim, boot)",
                );
                put("boot_ms", boot, "boot (BoxLite's start)");
                let t = Instant::now();
                let exec = engine
                    .exec("bench", &b, BoxCommand::new("true"))
                    .await
                    .unwrap();
                exec.wait().await.unwrap();
                put("first_exec_ms", t.elapsed(), "first exec `true`");
                let mut warm = Vec::new();
                for _ in 0..rounds {
                    let t = Instant::now();
                    let exec = engine
                        .exec("bench", &b, BoxCommand::new("true"))
                        .await
                        .unwrap();
                    exec.wait().await.unwrap();
                    warm.push(t.elapsed());
                }
                let warm = median(warm);
                put(
                    "warm_exec_ms",
                    warm,
                    "warm exec `true`, median (target < 25 ms on hardware KVM)",
                );
                let mut reuse = Vec::new();
                for _ in 0..rounds {
                    let t = Instant::now();
                    let (again, _) = engine.create(&spec).await.unwrap();
                    engine.start("bench", &again).await.unwrap();
                    reuse.push(t.elapsed());
                }
                put(
                    "reuse_running_ms",
                    median(reuse),
                    "reuse by name of a running box, median (target < 200 ms on hardware KVM)",
                );
                let t = Instant::now();
                engine.stop("bench", &b).await.unwrap();
                put("stop_ms", t.elapsed(), "stop");
            }
        }
        let _ = engine.remove("bench").await;
    });
    let ratio = |a: &str, b: &str| Some(report.get(a)?.as_f64()? / report.get(b)?.as_f64()?);
    let ratios = serde_json::json!({
        "warm_exec_over_spawn": ratio("warm_exec_ms", "spawn_true_ms"),
        "first_exec_over_warm_exec": ratio("first_exec_ms", "warm_exec_ms"),
        "reuse_running_over_warm_exec": ratio("reuse_running_ms", "warm_exec_ms"),
        "boot_over_warm_exec": ratio("boot_ms", "warm_exec_ms"),
    });
    println!("ratios: {ratios}");
    if json_out {
        report.insert("booted".into(), serde_json::json!(booted));
        report.insert("rounds".into(), serde_json::json!(rounds));
        report.insert("ratios".into(), ratios);
        println!("{}", serde_json::Value::Object(report));
    }
}
