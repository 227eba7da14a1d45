//! The lifecycle against a `limactl` stand-in the tests build (`fixtures/limactl-standin.sh`):
//! it records its argv and `LIMA_HOME` and plays back Lima's real log lines and exit codes
//! (`fixtures/playback/`). The product's own code — the lifecycle, the progress parsing, the
//! error mapping, the provisioning check — is what runs.

use std::ops::Deref;

use sandbox_lima::{LimaError, LimaSettings, VmEvent, VmState};
use sandbox_testkit::limactl;

use crate::common::Repo;

/// The kit's stand-in, with the settings that point the product at it.
struct Standin {
    limactl: limactl::Standin,
    settings: LimaSettings,
    repo: Repo,
}

impl Deref for Standin {
    type Target = limactl::Standin;
    fn deref(&self) -> &limactl::Standin {
        &self.limactl
    }
}

impl Standin {
    fn new() -> Self {
        let repo = Repo::new("app", "app-task");
        let limactl = limactl::Standin::install(&repo.base.join("standin"));
        let settings = LimaSettings {
            limactl: Some(limactl.exe()),
            home: repo.base.join("lh"),
            views_root: repo.base.join("views"),
            runtime_dir: repo.base.join("run"),
            nix_image: None,
            overrides_dir: repo.base.join("overrides"),
            private_dir: repo.base.join("private"),
            vhost_user_dirs: vec![limactl.vhost_user_dir()],
            start_timeout: None,
        };
        settings.ensure_home().unwrap();
        Standin {
            limactl,
            settings,
            repo,
        }
    }

    /// The recorded calls: the subcommand words (after the global flags), each with the
    /// LIMA_HOME it ran with.
    fn call_words(&self) -> Vec<String> {
        let text = self.limactl.calls();
        let home = format!("LIMA_HOME={}", self.settings.home.display());
        text.lines()
            .map(|l| {
                assert!(
                    l.starts_with(&home),
                    "a limactl call without the private LIMA_HOME: {l}"
                );
                let words: Vec<&str> = l[home.len()..].split_whitespace().collect();
                let words: Vec<&str> = words
                    .into_iter()
                    .filter(|w| !matches!(*w, "--log-format" | "json" | "--tty=false"))
                    .collect();
                words[..words.len().min(2)].join(" ")
            })
            .collect()
    }
}

#[test]
fn first_spawn_creates_starts_and_checks_with_named_steps() {
    let s = Standin::new();
    let view = s.repo.view(&s.repo.task);
    let p = s.settings.project(&view).unwrap();
    let mut steps = Vec::new();
    p.vm.ensure_running(&p.yaml, &mut |e| steps.push(e))
        .unwrap();
    let started: Vec<&str> = steps
        .iter()
        .filter_map(|e| match e {
            VmEvent::Step { step } => Some(*step),
            _ => None,
        })
        .collect();
    // Lima's own log names the steps: the image is fetched by `limactl create` (Lima 2.2's
    // `create` runs `instance.Prepare`), then start, SSH, provisioning.
    assert_eq!(
        started,
        vec![
            "checking the VM",
            "creating the VM",
            "downloading the image",
            "starting the VM",
            "connecting over SSH",
            "provisioning",
            "checking provisioning",
        ],
        "{steps:?}"
    );
    let start = format!("start {}", p.vm.instance);
    assert_eq!(
        s.call_words(),
        vec!["list --format", "create --name", &start, "shell --workdir"]
    );
    // The YAML Lima got is the generated one, in the private LIMA_HOME.
    let created: sandbox_lima::yaml::LimaYaml =
        serde_yaml::from_str(&std::fs::read_to_string(p.vm.yaml_path()).unwrap()).unwrap();
    assert_eq!(created, p.yaml);
}

#[test]
fn provisioning_is_idempotent_and_checked_by_its_sentinel() {
    let s = Standin::new();
    let view = s.repo.view(&s.repo.task);
    let p = s.settings.project(&view).unwrap();
    p.vm.ensure_running(&p.yaml, &mut |_| {}).unwrap();
    s.clear_calls();
    // A second spawn: the VM runs, the mounts are there, the sentinel holds this script's
    // hash: nothing is created or started again.
    p.vm.ensure_running(&p.yaml, &mut |_| {}).unwrap();
    assert_eq!(s.call_words(), vec!["list --format", "shell --workdir"]);
    // After a restart (stop, start), provisioning runs again and the check passes again.
    p.vm.stop(&mut |_| {}).unwrap();
    p.vm.ensure_running(&p.yaml, &mut |_| {}).unwrap();
    assert_eq!(p.vm.state().unwrap().0, VmState::Running);

    // Lima's `start` succeeds when provisioning failed: the missing sentinel is what tells.
    p.vm.stop(&mut |_| {}).unwrap();
    s.mode("provision", "fails");
    let err = p.vm.ensure_running(&p.yaml, &mut |_| {}).unwrap_err();
    assert!(matches!(err, LimaError::Provisioning { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("ha.stderr.log") && text.contains("provisioning"),
        "{text}"
    );
}

#[test]
fn failures_name_the_step_and_the_log() {
    for (mode, want) in [
        ("download-fails", "could not be downloaded"),
        ("no-kvm", "no hardware virtualisation"),
        ("degraded", "degraded"),
    ] {
        let s = Standin::new();
        let view = s.repo.view(&s.repo.task);
        let p = s.settings.project(&view).unwrap();
        // The image is fetched by `create`; the rest fails in `start`.
        s.mode(
            if mode == "download-fails" {
                "create"
            } else {
                "start"
            },
            mode,
        );
        let err = p.vm.ensure_running(&p.yaml, &mut |_| {}).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(want), "{mode}: {text}");
        let log = s.settings.home.join(&p.vm.instance).join("ha.stderr.log");
        assert!(text.contains(&log.display().to_string()), "{mode}: {text}");
    }
}

#[test]
fn a_missing_limactl_and_an_old_one_are_refused() {
    let s = Standin::new();
    let mut settings = s.settings.clone();
    settings.limactl = None;
    let view = s.repo.view(&s.repo.task);
    let err = settings.project(&view).unwrap_err().to_string();
    assert!(
        err.contains("limactl not found") && err.contains("SANDBOX_LIMACTL"),
        "{err}"
    );
    std::fs::write(s.dir.join("version"), "1.2.1").unwrap();
    let err = s
        .settings
        .limactl()
        .unwrap()
        .check_version()
        .unwrap_err()
        .to_string();
    assert!(err.contains("1.2.1") && err.contains("2.0.0"), "{err}");
    std::fs::write(s.dir.join("version"), "2.1.0").unwrap();
    s.settings.limactl().unwrap().check_version().unwrap();
}

#[test]
fn a_stopped_vm_takes_resources_on_start_and_refuses_a_recreate_change() {
    let s = Standin::new();
    let view = s.repo.view(&s.repo.task);
    let p = s.settings.project(&view).unwrap();
    p.vm.ensure_running(&p.yaml, &mut |_| {}).unwrap();
    p.vm.stop(&mut |_| {}).unwrap();
    std::fs::create_dir_all(&s.settings.overrides_dir).unwrap();
    std::fs::write(&p.overrides_path, "cpus: 6\nmemory: 8GiB\n").unwrap();
    let p2 = s.settings.project(&view).unwrap();
    p2.vm.ensure_running(&p2.yaml, &mut |_| {}).unwrap();
    assert_eq!(p2.vm.current_yaml().unwrap().cpus, 6);
    p2.vm.stop(&mut |_| {}).unwrap();
    std::fs::write(&p.overrides_path, "vmType: vz\n").unwrap();
    let p3 = s.settings.project(&view).unwrap();
    let err = p3.vm.ensure_running(&p3.yaml, &mut |_| {}).unwrap_err();
    assert!(matches!(err, LimaError::NeedsRecreate { .. }), "{err}");
    assert!(err.to_string().contains("vmType qemu → vz"), "{err}");
}

#[test]
fn a_new_view_restarts_an_idle_vm_but_not_a_busy_one() {
    let s = Standin::new();
    let a = s.repo.view(&s.repo.task);
    let p = s.settings.project(&a).unwrap();
    p.vm.ensure_running(&p.yaml, &mut |_| {}).unwrap();
    crate::common::git(
        &s.repo.main,
        &[
            "worktree",
            "add",
            "-q",
            s.repo.base.join("app-task2").to_str().unwrap(),
            "-b",
            "task2",
        ],
    );
    let b = s.repo.view(&s.repo.base.join("app-task2"));
    let pb = s.settings.project(&b).unwrap();
    assert_eq!(pb.vm.instance, p.vm.instance, "one VM per project");
    // Busy: a command of task A holds the sessions lock.
    let held = p.vm.sessions_lock(false).unwrap();
    let err = pb.vm.ensure_running(&pb.yaml, &mut |_| {}).unwrap_err();
    assert!(matches!(err, LimaError::MountsPending { .. }), "{err}");
    drop(held);
    s.clear_calls();
    pb.vm.ensure_running(&pb.yaml, &mut |_| {}).unwrap();
    let stop = format!("stop {}", p.vm.instance);
    let start = format!("start {}", p.vm.instance);
    assert_eq!(
        s.call_words(),
        vec!["list --format", &stop, &start, "shell --workdir"]
    );
    assert_eq!(pb.vm.current_yaml().unwrap().mounts, pb.yaml.mounts);
}

/// An image named by `SANDBOX_LIMA_IMAGE` can be rebuilt at the same path (`cargo xtask
/// lima-image` does, into a directory of its own, but a user's need not): the YAML then
/// carries the new file's digest, not the one cached for the path — Lima refuses a mismatch.
#[test]
fn an_image_rebuilt_in_place_gets_its_new_digest() {
    use sandbox_lima::yaml::ImageChoice;
    let mut s = Standin::new();
    let image = s.repo.base.join("guest.qcow2");
    let digest = |s: &Standin| match s.settings.image().unwrap() {
        ImageChoice::Nix { digest, .. } => digest,
        other => panic!("not the local image: {other:?}"),
    };
    std::fs::write(&image, b"first build").unwrap();
    s.settings.nix_image = Some(image.clone());
    let first = digest(&s);
    assert_eq!(first, digest(&s), "the cached digest is the same file's");
    std::fs::write(&image, b"the second build").unwrap();
    let second = digest(&s);
    assert_ne!(first, second, "the digest of the old file was kept");
    use sha2::Digest as _;
    let want = sha2::Sha256::digest(b"the second build");
    let hex: String = want.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(second, format!("sha256:{hex}"));
}
