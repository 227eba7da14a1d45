//! The engine against the real BoxLite runtime and the real runtime files: opening the runtime,
//! one runtime per home, importing an OCI layout, preparing the disks, starting the shim and
//! each way a start fails. Tests that need a booted guest run when the boot works here and
//! print `skipped: <reason>` otherwise (docs/boxlite.md, "On this build machine": no guest
//! boots through this build machine's own KVM; one does through the KVM inside a TCG guest,
//! `cargo xtask guest-test`'s harness).
//!
//! Needs the runtime files (`cargo xtask boxlite-runtime`, or `SANDBOX_BOXLITE_RUNTIME`);
//! without them every test here fails, naming the command to run.
#![cfg(feature = "boxlite")]
// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_boxlite::engine::{Engine, EngineOptions};
use sandbox_boxlite::layout;
use sandbox_boxlite::runtime_files::{self, RuntimeLocation};
use sandbox_boxlite::{BoxSpec, BoxliteError, ImageSource, Mount, NetTarget};

fn runtime() -> RuntimeLocation {
    runtime_files::locate().expect(
        "the BoxLite runtime files: run `cargo xtask boxlite-runtime` or set \
         SANDBOX_BOXLITE_RUNTIME",
    )
}

fn options(home: &Path) -> EngineOptions {
    let mut o = EngineOptions::new(home.to_path_buf());
    o.runtime = Some(runtime());
    o
}

/// `cargo xtask box-image`'s layout: a real Debian userland, with the shell and coreutils
/// the booted tests run (a layout without them would pass only where no guest boots).
fn image(_dir: &Path) -> PathBuf {
    layout::test_box_image().expect(
        "the box image: run `cargo xtask box-image` (target/box-image) or set \
         SANDBOX_TEST_BOX_IMAGE to an OCI layout",
    )
}

/// Whether this machine's KVM boots guests, judged before the boot (a test never decides
/// from a failed boot that the machine was at fault).
fn bootable() -> sandbox_boxlite::host::KvmBootable {
    sandbox_boxlite::host::kvm_bootable(Path::new("/dev/kvm"))
}

fn spec(name: &str, image: ImageSource) -> BoxSpec {
    BoxSpec {
        name: name.into(),
        image,
        cpus: Some(1),
        memory_mib: Some(512),
        disk_size_gb: None,
        mounts: vec![],
        share: None,
        allow_net: vec![],
        block_net: true,
        env: Default::default(),
        workdir: None,
    }
}

#[test]
fn runtime_files_that_are_missing_or_wrong_refuse_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("runtime");
    std::fs::create_dir(&files).unwrap();
    // A copy of the real files with one of them changed by a byte.
    for f in runtime_files::files() {
        std::fs::copy(runtime().dir.join(f.name), files.join(f.name)).unwrap();
    }
    let victim = files.join("boxlite-guest");
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&victim, bytes).unwrap();
    std::fs::remove_file(files.join("mke2fs")).unwrap();

    let mut o = EngineOptions::new(dir.path().join("home"));
    o.runtime = Some(RuntimeLocation {
        dir: files.clone(),
        source: "test",
    });
    let err = Engine::open(o)
        .err()
        .expect("a mismatched runtime opens nothing");
    let text = err.to_string();
    assert!(matches!(err, BoxliteError::RuntimeFiles { .. }), "{text}");
    assert!(text.contains("boxlite-guest: sha256"), "{text}");
    assert!(text.contains("mke2fs: missing"), "{text}");
    assert!(text.contains("cargo xtask boxlite-runtime"), "{text}");
    assert!(!dir.path().join("home").exists(), "no runtime was started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_runtime_per_home() {
    let dir = tempfile::tempdir().unwrap();
    let first = Engine::open(options(dir.path())).unwrap();
    assert!(dir.path().join(".lock").exists(), "BoxLite's home lock");
    let second = Engine::open(options(dir.path()));
    match second {
        Err(BoxliteError::RuntimeBusy { home, detail }) => {
            assert_eq!(home, dir.path());
            assert!(detail.contains("Only one runtime"), "{detail}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a second runtime opened on the same home"),
    }
    // Another home is another runtime.
    let other = tempfile::tempdir().unwrap();
    let _ = Engine::open(options(other.path())).unwrap();
    drop(first);
}

#[test]
fn mount_network_and_size_options_reach_boxlite() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec("opts", ImageSource::Layout(image(dir.path())));
    s.cpus = Some(2);
    s.memory_mib = Some(1024);
    s.disk_size_gb = Some(4);
    s.mounts = vec![
        Mount {
            host: "/work/project".into(),
            guest: "/work/project".into(),
            read_only: false,
        },
        Mount {
            host: "/work/project.git".into(),
            guest: "/work/project.git".into(),
            read_only: true,
        },
    ];
    s.block_net = false;
    s.allow_net = vec![
        NetTarget::parse("registry.npmjs.org").unwrap(),
        NetTarget::parse("10.0.0.0/8").unwrap(),
    ];
    s.env.insert("A".into(), "1".into());
    s.workdir = Some("/work/project".into());
    let o = Engine::options_for(&s);
    assert_eq!(
        (o.cpus, o.memory_mib, o.disk_size_gb),
        (Some(2), Some(1024), Some(4))
    );
    let vols: Vec<_> = o
        .volumes
        .iter()
        .map(|v| (v.host_path.as_str(), v.guest_path.as_str(), v.read_only))
        .collect();
    assert_eq!(
        vols,
        [
            ("/work/project", "/work/project", false),
            ("/work/project.git", "/work/project.git", true)
        ]
    );
    match &o.network {
        boxlite::NetworkSpec::Enabled { allow_net } => {
            assert_eq!(allow_net, &["registry.npmjs.org", "10.0.0.0/8"])
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(o.env, [("A".to_string(), "1".to_string())]);
    assert_eq!(o.working_dir.as_deref(), Some("/work/project"));
    assert_eq!(
        o.auto_delete,
        Some(0),
        "kept after a stop, for reuse by name"
    );
    assert!(!o.detach, "stopped with the daemon that owns it");
    match &o.rootfs {
        boxlite::RootfsSpec::RootfsPath(p) => assert!(Path::new(p).join("oci-layout").is_file()),
        other => panic!("{other:?}"),
    }
    s.block_net = true;
    assert!(matches!(
        Engine::options_for(&s).network,
        boxlite::NetworkSpec::Disabled
    ));
}

/// Import, disk preparation, the shim, and the boot: the one test that boots. Where this
/// machine's KVM can boot guests (hardware virtualisation behind `/dev/kvm`) the boot must
/// work and the test goes on into the guest; where it cannot (this build machine's kvm-pvm),
/// the failure must name log files that exist, and the rest is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_is_imported_its_disks_prepared_and_the_box_boots() {
    let kvm = bootable();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let engine = Engine::open(options(&home)).unwrap();
    let s = spec("boot", ImageSource::Layout(image(dir.path())));
    let (b, created) = engine.create(&s).await.unwrap();
    assert!(created);
    // Reuse by name: the same box, not a second one.
    let (again, created) = engine.create(&s).await.unwrap();
    assert!(!created);
    assert_eq!(again.id(), b.id());
    assert_eq!(engine.list().await.unwrap().len(), 1);

    let started = engine.start("boot", &b).await;
    // Whatever the boot did, the image was imported and the disks prepared.
    let disk_images: Vec<_> = std::fs::read_dir(home.join("images/disk-images"))
        .unwrap()
        .collect();
    assert!(!disk_images.is_empty(), "the layout became an ext4 image");
    let box_dir = home.join("boxes").join(b.id().as_str());
    assert!(
        box_dir.join("disks/disk.qcow2").is_file(),
        "the box's copy-on-write disk"
    );
    match started {
        Ok(boot) => {
            eprintln!("booted in {boot:?}");
            let exec = engine
                .exec(
                    "boot",
                    &b,
                    boxlite::BoxCommand::new("/bin/sh").args(["-c", "echo hi; exit 3"]),
                )
                .await
                .unwrap();
            let result = exec.wait().await.unwrap();
            assert_eq!(result.exit_code, 3);
            engine.stop("boot", &b).await.unwrap();
        }
        Err(e) if !kvm.bootable => {
            let logs = e.logs().unwrap().clone();
            let text = e.to_string();
            for p in [&logs.shim_stderr, &logs.shim].into_iter().flatten() {
                assert!(p.exists(), "{} named but absent", p.display());
                assert!(text.contains(&p.display().to_string()), "{text}");
            }
            sandbox_testkit::skip(
                "guest-boot",
                format_args!("commands in a booted guest ({}): {text}", kvm.detail),
            );
        }
        Err(e) => panic!(
            "guests boot here ({}), but this one did not: {e}",
            kvm.detail
        ),
    }
    engine.remove("boot").await.unwrap();
    assert!(engine.list().await.unwrap().is_empty());
    assert!(!box_dir.exists(), "remove deletes the box's directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_start_failure_is_specific_and_names_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut o = options(&home);
    // No KVM device: refused before the shim starts.
    o.kvm_device = dir.path().join("no-kvm");
    let engine = Engine::open(o).unwrap();
    let s = spec("nokvm", ImageSource::Layout(image(dir.path())));
    let (b, _) = engine.create(&s).await.unwrap();
    let err = engine.start("nokvm", &b).await.unwrap_err();
    assert!(matches!(err, BoxliteError::NoKvm { .. }), "{err}");
    assert!(err.to_string().contains("no-kvm"), "{err}");
    assert!(
        err.to_string()
            .contains(&home.join("logs").display().to_string()),
        "{err}"
    );
    drop(engine);

    // A guest that is not ready in time.
    let home2 = dir.path().join("home2");
    let mut o = options(&home2);
    o.ready_timeout = Duration::from_millis(50);
    let mut engine = Engine::open(o).unwrap();
    let (b, _) = engine
        .create(&spec("slow", ImageSource::Layout(image(dir.path()))))
        .await
        .unwrap();
    let err = engine.start("slow", &b).await.unwrap_err();
    assert!(matches!(err, BoxliteError::GuestNotReady { .. }), "{err}");
    assert!(err.to_string().contains("not ready after"), "{err}");
    assert!(err.to_string().contains("shim.stderr"), "{err}");

    // An image that cannot be had: a registry that refuses connections.
    let (b, _) = engine
        .create(&spec(
            "absent",
            ImageSource::Registry("127.0.0.1:9/absent:latest".into()),
        ))
        .await
        .unwrap();
    engine.set_ready_timeout(EngineOptions::new(home2.clone()).ready_timeout);
    let err = engine.start("absent", &b).await.unwrap_err();
    assert!(matches!(err, BoxliteError::ImageMissing { .. }), "{err}");
    assert!(err.to_string().contains("image missing"), "{err}");

    // A layout directory that is not one.
    let not_layout = dir.path().join("empty");
    std::fs::create_dir(&not_layout).unwrap();
    let err = engine
        .create(&spec("bad", ImageSource::Layout(not_layout)))
        .await
        .err()
        .unwrap();
    assert_eq!(err.reason(), "imageMissing", "{err}");
    assert!(err.to_string().contains("oci-layout"), "{err}");
}

/// A box the shim cannot build (more devices than libkrun has interrupts for: eight shares
/// and the network) fails as `devicesExhausted` with the shim's own words and the device
/// count, not a guess about KVM, on a machine whose KVM boots guests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_the_shim_refuses_reports_the_shims_error() {
    let kvm = bootable();
    if !kvm.bootable {
        sandbox_testkit::skip(
            "guest-boot",
            format_args!("the shim's error after a boot attempt ({})", kvm.detail),
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let engine = Engine::open(options(&home)).unwrap();
    let mut s = spec("crowded", ImageSource::Layout(image(dir.path())));
    s.block_net = false;
    for i in 0..8 {
        let host = dir.path().join(format!("share{i}"));
        std::fs::create_dir(&host).unwrap();
        s.mounts.push(Mount {
            host,
            guest: format!("/share{i}").into(),
            read_only: true,
        });
    }
    let (b, _) = engine.create(&s).await.unwrap();
    let err = engine.start("crowded", &b).await.unwrap_err();
    let text = err.to_string();
    assert_eq!(err.reason(), "devicesExhausted", "{text}");
    assert!(!text.contains("cannot boot"), "no KVM guess: {text}");
    assert!(text.contains("shim:"), "the shim's line: {text}");
    assert!(text.contains("Irqs"), "the shim's reason: {text}");
    // BoxLite's seven, eight shares, the network.
    assert!(text.contains("16 virtio devices"), "the count: {text}");
    let _ = engine.remove("crowded").await;
}
