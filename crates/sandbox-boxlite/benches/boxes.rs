//! BoxLite boxes: create, boot, warm exec and reuse by name, against the real runtime.
//!
//! `BOXLITE_DEPS_STUB=1 cargo bench -p sandbox-boxlite --features boxlite --bench boxes`
//! (`--profile release` or `--profile dev` where the `bench` profile's fat LTO of BoxLite's
//! dependency tree takes too long; the engine's time is in the guest and the shim, not here)
//! (after `cargo xtask boxlite-runtime`). Targets on hardware KVM (BENCHMARKS.md): reuse by name
//! < 200 ms, warm exec < 25 ms. Steps that need a booted guest print `skipped: <reason>`
//! where the boot fails (this build machine's kvm-pvm).

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
    use sandbox_boxlite::layout::{self, LayerFile};
    use sandbox_boxlite::{BoxSpec, ImageSource};

    fn median(mut v: Vec<Duration>) -> Duration {
        v.sort();
        v[v.len() / 2]
    }
    fn ms(d: Duration) -> String {
        format!("{:.2} ms", d.as_secs_f64() * 1000.0)
    }

    let dir = tempfile::tempdir().unwrap();
    let image = layout::test_box_image().unwrap_or_else(|| {
        layout::write_tiny_layout(
            &dir.path().join("image"),
            &[LayerFile {
                path: "etc/hostname",
                mode: 0o644,
                data: b"bench\n",
            }],
            &["/bin/sh"],
        )
        .unwrap()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let t = Instant::now();
        let engine = Engine::open(EngineOptions::new(dir.path().join("home"))).unwrap();
        println!("open runtime (lock, checks, store): {}", ms(t.elapsed()));
        let spec = BoxSpec {
            name: "bench".into(),
            image: ImageSource::Layout(image),
            cpus: Some(1),
            memory_mib: Some(512),
            disk_size_gb: None,
            mounts: vec![],
            allow_net: vec![],
            block_net: true,
            env: Default::default(),
            workdir: None,
        };
        let t = Instant::now();
        let (b, created) = engine.create(&spec).await.unwrap();
        assert!(created);
        println!("create (new name, before boot): {}", ms(t.elapsed()));
        let mut reuse = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            let (_, created) = engine.create(&spec).await.unwrap();
            assert!(!created);
            reuse.push(t.elapsed());
        }
        println!(
            "reuse by name (box not running), median of 50: {}",
            ms(median(reuse))
        );
        let t = Instant::now();
        match engine.start("bench", &b).await {
            Err(e) => {
                println!(
                    "first start (import, disks, shim, boot): failed after {}",
                    ms(t.elapsed())
                );
                println!("skipped: boot, warm exec and reuse of a running box: {e}");
            }
            Ok(boot) => {
                println!("boot: {}", ms(boot));
                let mut warm = Vec::new();
                for _ in 0..50 {
                    let t = Instant::now();
                    let exec = engine
                        .exec("bench", &b, BoxCommand::new("true"))
                        .await
                        .unwrap();
                    exec.wait().await.unwrap();
                    warm.push(t.elapsed());
                }
                println!(
                    "warm exec `true`, median of 50: {} (target < 25 ms)",
                    ms(median(warm))
                );
                let mut reuse = Vec::new();
                for _ in 0..50 {
                    let t = Instant::now();
                    let (again, _) = engine.create(&spec).await.unwrap();
                    engine.start("bench", &again).await.unwrap();
                    reuse.push(t.elapsed());
                }
                println!(
                    "reuse by name of a running box, median of 50: {} (target < 200 ms)",
                    ms(median(reuse))
                );
                engine.stop("bench", &b).await.unwrap();
            }
        }
        let _ = engine.remove("bench").await;
    });
}
