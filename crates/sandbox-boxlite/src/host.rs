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

/// Whether the KVM here can boot a stock guest kernel, judged without booting one: the
/// device opens and the CPU shows hardware virtualisation (`vmx` or `svm` among
/// `/proc/cpuinfo`'s flags). A paravirtualised KVM such as kvm-pvm opens and runs simple code
/// but shows neither flag, and no stock kernel boots through it; inside a guest that is given
/// virtualisation (QEMU `-cpu max`, a cloud VM with nesting) the flag is there and guests boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KvmBootable {
    pub bootable: bool,
    pub detail: String,
}

/// [`KvmBootable`] for `device`, from this machine's `/proc/cpuinfo`.
pub fn kvm_bootable(device: &Path) -> KvmBootable {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    judge_kvm(&kvm_device(device), device, &cpuinfo)
}

fn judge_kvm(device_state: &KvmDevice, device: &Path, cpuinfo: &str) -> KvmBootable {
    let no = |detail: String| KvmBootable {
        bootable: false,
        detail,
    };
    match device_state {
        KvmDevice::Missing => return no(format!("no {}", device.display())),
        KvmDevice::Denied(e) => return no(format!("{} cannot be opened: {e}", device.display())),
        KvmDevice::Usable => {}
    }
    let flag = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .find(|f| *f == "vmx" || *f == "svm");
    match flag {
        Some(f) => KvmBootable {
            bootable: true,
            detail: format!(
                "{} opens and the CPU has hardware virtualisation ({f})",
                device.display()
            ),
        },
        None => {
            let pvm = if Path::new("/sys/module/kvm_pvm").exists() {
                " (kvm_pvm is loaded: a paravirtualised KVM)"
            } else {
                ""
            };
            no(format!(
                "{} opens, but the CPU shows no hardware virtualisation (neither vmx nor svm \
                 in /proc/cpuinfo){pvm}: no stock guest kernel boots through this KVM",
                device.display()
            ))
        }
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
        let program = probe_program().ok_or_else(|| crate::BoxliteError::Runtime {
            what: "writing the probe image",
            detail: format!(
                "no probe program for {} (only x86_64 is pinned)",
                std::env::consts::ARCH
            ),
        })?;
        let layout = crate::layout::write_tiny_layout(
            &scratch.path().join("image"),
            &[crate::layout::LayerFile {
                path: "probe",
                mode: 0o755,
                data: &program,
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
        // The probe's own bound, unless the machine is known to be slower
        // (`SANDBOX_BOXLITE_READY_TIMEOUT`).
        options.ready_timeout = options.ready_timeout.max(PROBE_TIMEOUT);
        let engine = Engine::open(options)?;
        let spec = crate::BoxSpec {
            name: "sandbox-boot-probe".into(),
            image: crate::ImageSource::Layout(layout),
            cpus: Some(1),
            memory_mib: Some(256),
            disk_size_gb: None,
            mounts: vec![],
            share: None,
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

/// The probe image's one program, `/probe`: a static x86_64 Linux executable of 200 bytes
/// that waits (`pause()` in a loop) until SIGTERM, then exits 0 — so the box's init runs and
/// stays up, and a stop ends it at once (as a container's PID 1 it would ignore a signal it
/// has no handler for). Written out here because the probe needs an image but not a
/// userland, and an image's command must be an executable (BoxLite's guest refuses a box
/// whose command is not: "does not have correct permissions").
pub fn probe_program() -> Option<Vec<u8>> {
    if std::env::consts::ARCH != "x86_64" {
        return None;
    }
    const BASE: u64 = 0x40_0000;
    const HEADERS: u64 = 64 + 56;
    const HANDLER: u64 = 36;
    const ACTION: u64 = 48;
    #[rustfmt::skip]
    const CODE: [u8; 48] = [
        // rt_sigaction(SIGTERM, &action, NULL, 8)
        0x48, 0x8d, 0x35, (ACTION - 7) as u8, 0, 0, 0, // lea rsi, [rip + action]
        0xbf, 15, 0, 0, 0,                              // mov edi, 15
        0x31, 0xd2,                                     // xor edx, edx
        0x41, 0xba, 8, 0, 0, 0,                         // mov r10d, 8
        0xb8, 13, 0, 0, 0,                              // mov eax, 13
        0x0f, 0x05,                                     // syscall
        // wait: pause() forever
        0xb8, 34, 0, 0, 0,                              // mov eax, 34
        0x0f, 0x05,                                     // syscall
        0xeb, 0xf7,                                     // jmp wait
        // the handler (offset 36): exit_group(0); it never returns
        0xb8, 231, 0, 0, 0,                             // mov eax, 231
        0x31, 0xff,                                     // xor edi, edi
        0x0f, 0x05,                                     // syscall
        0, 0, 0,                                        // to the action's alignment
    ];
    let size = HEADERS + CODE.len() as u64 + 32;
    let mut elf = Vec::with_capacity(size as usize);
    // The ELF header: 64-bit, little-endian, version 1, System V ABI.
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    elf.extend_from_slice(&[0; 8]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&0x3eu16.to_le_bytes()); // EM_X86_64
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&(BASE + HEADERS).to_le_bytes()); // entry: the code
    elf.extend_from_slice(&64u64.to_le_bytes()); // program headers right after
    elf.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    elf.extend_from_slice(&0u32.to_le_bytes());
    for half in [64u16, 56, 1, 64, 0, 0] {
        elf.extend_from_slice(&half.to_le_bytes());
    }
    // One PT_LOAD, read + execute, mapping the whole file at BASE.
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&5u32.to_le_bytes());
    for word in [0, BASE, BASE, size, size, 0x1000] {
        elf.extend_from_slice(&word.to_le_bytes());
    }
    elf.extend_from_slice(&CODE);
    // The kernel's struct sigaction: handler, flags, restorer, mask (none blocked). x86_64
    // delivers no signal to a handler without SA_RESTORER (it raises SIGSEGV instead); the
    // restorer is never reached, as the handler does not return.
    const SA_RESTORER: u64 = 0x0400_0000;
    let handler = BASE + HEADERS + HANDLER;
    for word in [handler, SA_RESTORER, handler, 0] {
        elf.extend_from_slice(&word.to_le_bytes());
    }
    Some(elf)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe's program is a real executable here: it starts, waits, and exits 0 on
    /// SIGTERM (the text file the probe image held before could not be run at all).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_probe_program_runs_waits_and_ends_on_sigterm() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe");
        std::fs::write(&path, probe_program().unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = std::process::Command::new(&path).spawn().unwrap();
        // Running (not exited with an exec error): it sleeps in pause().
        let state = loop {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
            let state = stat
                .rsplit(')')
                .next()
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            // R while it starts; D while its pages come in from disk (seen under load).
            if state != "R" && state != "D" {
                break state.to_string();
            }
            std::thread::yield_now();
        };
        assert_eq!(state, "S", "the probe program waits");
        assert!(child.try_wait().unwrap().is_none(), "it did not exit");
        // Its handler is installed before it first sleeps: SIGTERM is a clean exit.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert_eq!(child.wait().unwrap().code(), Some(0));
    }

    #[test]
    fn kvm_is_bootable_only_with_the_device_and_a_virtualisation_flag() {
        let dev = Path::new("/dev/kvm");
        let svm = "processor : 0\nflags : fpu vme svm lm\n";
        let none = "processor : 0\nflags : fpu vme hypervisor lm\n";
        assert!(judge_kvm(&KvmDevice::Usable, dev, svm).bootable);
        assert!(judge_kvm(&KvmDevice::Usable, dev, "flags\t: vmx\n").bootable);
        let pvm = judge_kvm(&KvmDevice::Usable, dev, none);
        assert!(!pvm.bootable);
        assert!(
            pvm.detail.contains("no hardware virtualisation"),
            "{}",
            pvm.detail
        );
        assert!(!judge_kvm(&KvmDevice::Missing, dev, svm).bootable);
        let denied = judge_kvm(&KvmDevice::Denied("EACCES".into()), dev, svm);
        assert!(!denied.bootable && denied.detail.contains("EACCES"));
        // A flag's name inside another word is no flag.
        assert!(!judge_kvm(&KvmDevice::Usable, dev, "flags : svmx\n").bootable);
    }
}
