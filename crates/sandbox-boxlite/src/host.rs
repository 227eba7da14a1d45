//! Can this host boot BoxLite guests? First the KVM device, then — with the engine in the
//! build and the runtime files present — a real boot: a throwaway box from a tiny image in a
//! scratch home, started with a short timeout. Only a guest agent that answers proves it; a
//! KVM that opens is not enough (a paravirtualised KVM such as kvm-pvm opens and runs simple
//! code, then fails the guest kernel).

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The KVM device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state", content = "detail")]
pub enum KvmDevice {
    Missing,
    Denied(String),
    Usable,
}

/// Whether `device` exists and opens read-write.
pub fn kvm_device(device: &Path) -> KvmDevice {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
    {
        Ok(_) => KvmDevice::Usable,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => KvmDevice::Missing,
        Err(e) => KvmDevice::Denied(e.to_string()),
    }
}

/// The outcome of the boot probe.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootProbe {
    pub can_boot: bool,
    /// What was proven, or why not.
    pub detail: String,
    /// `noKvm`, `kvmCannotBoot`, … (see [`crate::BoxliteError::reason`]); `None` when it booted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub elapsed_ms: u64,
}

/// How long the probe waits for the guest agent (a good host boots in about a second; libkrun
/// gives up on a KVM that cannot run the kernel after about 20 s here).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Boots a throwaway box with its BoxLite home in `home` (emptied first and left behind, so
/// the log paths a failure names stay readable), or in a temporary directory. Blocking; runs
/// its own async runtime.
#[cfg(feature = "boxlite")]
pub fn probe_boot(
    runtime: Option<crate::runtime_files::RuntimeLocation>,
    home: Option<&Path>,
) -> BootProbe {
    use crate::engine::{Engine, EngineOptions};
    let started = std::time::Instant::now();
    let finish = |result: Result<String, crate::BoxliteError>| {
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match result {
            Ok(detail) => BootProbe {
                can_boot: true,
                detail,
                reason: None,
                elapsed_ms,
            },
            Err(e) => BootProbe {
                can_boot: false,
                reason: Some(e.reason().to_string()),
                detail: e.to_string(),
                elapsed_ms,
            },
        }
    };
    let scratch = match tempfile::Builder::new()
        .prefix("sandbox-boxlite-probe-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => {
            return finish(Err(crate::BoxliteError::Runtime {
                what: "creating a scratch home for the boot probe",
                detail: e.to_string(),
            }))
        }
    };
    if let KvmDevice::Missing = kvm_device(Path::new("/dev/kvm")) {
        return finish(Err(crate::BoxliteError::NoKvm {
            name: "probe".into(),
            device: "/dev/kvm".into(),
            logs: Box::default(),
        }));
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return finish(Err(crate::BoxliteError::Runtime {
                what: "starting the probe's async runtime",
                detail: e.to_string(),
            }))
        }
    };
    let result = rt.block_on(async {
        let layout = crate::layout::write_tiny_layout(
            &scratch.path().join("image"),
            &[crate::layout::LayerFile {
                path: "probe",
                mode: 0o644,
                data: b"sandbox boot probe\n",
            }],
            &["/probe"],
        )
        .map_err(|e| crate::BoxliteError::Runtime {
            what: "writing the probe image",
            detail: e.to_string(),
        })?;
        let home = match home {
            Some(h) => {
                let _ = std::fs::remove_dir_all(h);
                h.to_path_buf()
            }
            None => scratch.path().join("home"),
        };
        let mut options = EngineOptions::new(home);
        options.runtime = runtime;
        options.ready_timeout = PROBE_TIMEOUT;
        let engine = Engine::open(options)?;
        let spec = crate::BoxSpec {
            name: "sandbox-boot-probe".into(),
            image: crate::ImageSource::Layout(layout),
            cpus: Some(1),
            memory_mib: Some(256),
            disk_size_gb: None,
            mounts: vec![],
            allow_net: vec![],
            block_net: true,
            env: Default::default(),
            workdir: None,
        };
        let (b, _) = engine.create(&spec).await?;
        let started = engine.start(&spec.name, &b).await;
        // A failed box stays, so the logs its error names can still be read.
        if started.is_ok() {
            let _ = engine.stop(&spec.name, &b).await;
            let _ = engine.remove(&spec.name).await;
        }
        let _ = engine.shutdown(Duration::from_secs(5)).await;
        let boot = started?;
        Ok(format!(
            "a guest booted and its agent answered in {} ms",
            boot.as_millis()
        ))
    });
    drop(rt);
    finish(result)
}

/// Without the engine there is nothing to boot with.
#[cfg(not(feature = "boxlite"))]
pub fn probe_boot(
    _runtime: Option<crate::runtime_files::RuntimeLocation>,
    _home: Option<&Path>,
) -> BootProbe {
    BootProbe {
        can_boot: false,
        detail: crate::BoxliteError::NotInBuild.to_string(),
        reason: Some("notInBuild".into()),
        elapsed_ms: 0,
    }
}
