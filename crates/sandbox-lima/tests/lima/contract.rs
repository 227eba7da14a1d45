//! The generator against Lima's documented YAML (`fixtures/lima-default.yaml`, the contract
//! in `../shared/contracts/`): every key emitted is documented, with a documented value form;
//! the mounts are exactly the view's; the command line of each lifecycle step.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use sandbox_lima::mounts::{project_mounts, LimaMount};
use sandbox_lima::yaml::{self, ImageChoice, Inputs, Overrides, Platform};
use sandbox_lima::Limactl;

use crate::common::Repo;

const CONTRACT: &str = include_str!("../fixtures/lima-default.yaml");

/// Lines of the contract, uncommented (`# key:` → `key:`), with their indentation.
fn contract_lines() -> Vec<String> {
    CONTRACT
        .lines()
        .map(|l| {
            let t = l.trim_start();
            match t.strip_prefix('#') {
                Some(rest) => rest.strip_prefix(' ').unwrap_or(rest).to_string(),
                None => l.to_string(),
            }
        })
        .collect()
}

/// A line that opens a top-level key (live or commented): `key:` at column 0.
fn is_top(line: &str) -> bool {
    let Some((key, rest)) = line.split_once(':') else {
        return false;
    };
    key.starts_with(|c: char| c.is_ascii_alphabetic())
        && key.chars().all(|c| c.is_ascii_alphanumeric())
        && (rest.is_empty() || rest.starts_with(' '))
}

/// Whether `path` (`ssh.forwardAgent`, `mounts[].mountPoint`) is documented: its top-level
/// key exists (live or commented), and each nested key appears in that key's region of the
/// document (between the top-level keys around it) as a key (`key:`) or named (`` `key` ``).
fn documented(path: &str) -> bool {
    let parts: Vec<&str> = path.split('.').collect();
    let top = parts[0].trim_end_matches("[]");
    let lines = contract_lines();
    let Some(at) = lines.iter().position(|l| l.starts_with(&format!("{top}:"))) else {
        return false;
    };
    let from = lines[..at]
        .iter()
        .rposition(|l| is_top(l))
        .map_or(0, |i| i + 1);
    let to = lines[at + 1..]
        .iter()
        .position(|l| is_top(l))
        .map_or(lines.len(), |i| at + 1 + i);
    let region = &lines[from..to];
    parts[1..].iter().all(|p| {
        let key = p.trim_end_matches("[]");
        region.iter().any(|l| {
            let t = l.trim_start().trim_start_matches("- ");
            t.starts_with(&format!("{key}:")) || l.contains(&format!("`{key}`"))
        })
    })
}

/// Every key path of a YAML value (`a.b`, `list[].key`).
fn key_paths(v: &serde_yaml::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            for (k, v) in m {
                let k = k.as_str().unwrap();
                let p = if prefix.is_empty() {
                    k.to_string()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                key_paths(v, &p, out);
            }
        }
        serde_yaml::Value::Sequence(s) => {
            let p = format!("{prefix}[]");
            for v in s {
                key_paths(v, &p, out);
            }
        }
        _ => {}
    }
}

fn generated(
    platform: Platform,
    image: &ImageChoice,
    overrides: &Overrides,
) -> (yaml::LimaYaml, Repo) {
    let repo = Repo::new("app", "app-task");
    let view = repo.view(&repo.task);
    let (mounts, layouts) = project_mounts(&[view]).unwrap();
    let y = yaml::generate(&Inputs {
        platform,
        arch: "x86_64",
        image,
        mounts: &mounts,
        views: &layouts,
        overrides,
    });
    (y, repo)
}

#[test]
fn every_emitted_key_is_documented() {
    let nix = ImageChoice::Nix {
        path: "/nix/store/abc-lima-image/nixos.qcow2".into(),
        digest: format!("sha256:{}", "a".repeat(64)),
    };
    for (platform, image) in [
        (Platform::Linux, &ImageChoice::Ubuntu),
        (Platform::MacOs, &nix),
    ] {
        let (y, _repo) = generated(platform, image, &Overrides::default());
        let value: serde_yaml::Value = serde_yaml::from_str(&y.to_yaml()).unwrap();
        let mut paths = BTreeSet::new();
        key_paths(&value, "", &mut paths);
        assert!(paths.len() > 20, "{paths:?}");
        let undocumented: Vec<&String> = paths.iter().filter(|p| !documented(p)).collect();
        assert!(
            undocumented.is_empty(),
            "keys not in Lima's documented YAML: {undocumented:?}"
        );
    }
    // The check can fail: a key Lima does not have is caught.
    assert!(!documented("mounts[].readOnly"));
    assert!(!documented("containerd.rootless"));
    assert!(!documented("vmKind"));
}

/// A value in the form the contract documents for its key.
#[test]
fn every_value_has_a_documented_form() {
    let (y, _repo) = generated(Platform::Linux, &ImageChoice::Ubuntu, &Overrides::default());
    let quoted = |v: &str| CONTRACT.contains(&format!("\"{v}\""));
    assert!(quoted(&y.vm_type), "vmType {}", y.vm_type);
    assert!(quoted(&y.arch), "arch {}", y.arch);
    assert!(quoted(&y.mount_type), "mountType {}", y.mount_type);
    assert!(CONTRACT.contains(&format!("minimumLimaVersion: {}", y.minimum_lima_version)));
    // Sizes in the documented form ("4GiB"), digests as "sha256:…".
    for size in [&y.memory, &y.disk] {
        assert!(
            size.ends_with("GiB") && yaml::parse_size(size).is_some(),
            "{size}"
        );
    }
    for image in &y.images {
        assert!(
            yaml::is_digest(image.digest.as_deref().unwrap()),
            "{image:?}"
        );
        assert!(quoted(&image.arch));
    }
    for p in &y.provision {
        assert!(CONTRACT.contains(&format!("- mode: {}", p.mode)));
        // Lima expands Go templates in provisioning scripts: ours must hold none.
        assert!(!p.script.contains("{{"), "a Go template in the script");
    }
    for f in &y.port_forwards {
        // Documented as `proto: "tcp" (other options: "udp, "any")`.
        assert!(
            CONTRACT.contains(&format!("\"{}", f.proto)),
            "proto {}",
            f.proto
        );
    }
    assert!(!y.containerd.system && !y.containerd.user);
    assert!(!y.ssh.forward_agent && !y.ssh.load_dot_ssh_pub_keys);
    // macOS picks vz and virtiofs.
    let (mac, _r) = generated(Platform::MacOs, &ImageChoice::Ubuntu, &Overrides::default());
    assert_eq!(
        (mac.vm_type.as_str(), mac.mount_type.as_str()),
        ("vz", "virtiofs")
    );
    assert!(quoted("vz") && quoted("virtiofs"));
    // Linux picks QEMU and virtiofs too, never Lima's 9p default: an overlay cannot use a 9p
    // upper layer (and mapped-xattr corrupts objects after git gc).
    assert_eq!(
        (y.vm_type.as_str(), y.mount_type.as_str()),
        ("qemu", "virtiofs")
    );
    for other in ["9p", "reverse-sshfs"] {
        let e = Overrides::parse(&format!("mountType: {other}\n")).unwrap_err();
        assert!(e.contains("cannot carry the views' git store layer"), "{e}");
    }
    assert!(Overrides::parse("mountType: virtiofs\n").is_ok());
}

fn m(location: &Path, writable: bool) -> LimaMount {
    LimaMount {
        location: location.to_path_buf(),
        mount_point: location.to_path_buf(),
        writable,
    }
}

/// The mounts are exactly: the common dir (ro), and per view the view, its admin dir and its
/// git store layer (rw). For several layouts.
#[test]
fn mounts_are_exactly_the_views() {
    for (repo_dir, task_dir) in [
        ("app", "app-task"),
        ("deep/nested/path/app", "wt/nested/task"),
        ("with space/my app", "task dir with space/task"),
    ] {
        let repo = Repo::new(repo_dir, task_dir);
        let view = repo.view(&repo.task);
        let common = PathBuf::from(crate::common::git(
            &repo.main,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        ));
        let (mounts, layouts) = project_mounts(std::slice::from_ref(&view)).unwrap();
        let want = vec![
            m(&common, false),
            m(&view.view_path, true),
            m(&view.store_layer_dir(), true),
            m(&common.join("worktrees").join(&view.worktree_name), true),
        ];
        assert_eq!(mounts, want, "layout {repo_dir} / {task_dir}");
        // Nothing of the user's: not the task worktree, not the main worktree, not a home.
        for mount in &mounts {
            assert!(!mount.location.starts_with(&repo.task), "{mount:?}");
            assert!(
                mount.location == common
                    || !mount.location.starts_with(&repo.main)
                    || mount.location.starts_with(&common)
            );
            if let Some(home) = std::env::var_os("HOME") {
                assert_ne!(mount.location, PathBuf::from(home));
            }
        }
        assert_eq!(layouts.len(), 1);
        assert_eq!(
            layouts[0].admin_dir,
            common.join("worktrees").join(&view.worktree_name)
        );
        // The generated YAML carries exactly these mounts.
        let y = yaml::generate(&Inputs {
            platform: Platform::Linux,
            arch: "x86_64",
            image: &ImageChoice::Ubuntu,
            mounts: &mounts,
            views: &layouts,
            overrides: &Overrides::default(),
        });
        assert_eq!(y.mounts, want);
    }
}

/// Two tasks of one project share the VM: one read-only common dir, each view's own mounts.
#[test]
fn parallel_tasks_share_the_common_dir_mount() {
    let repo = Repo::new("app", "app-task");
    crate::common::git(
        &repo.main,
        &[
            "worktree",
            "add",
            "-q",
            repo.base.join("app-task2").to_str().unwrap(),
            "-b",
            "task2",
        ],
    );
    let a = repo.view(&repo.task);
    let b = repo.view(&repo.base.join("app-task2"));
    let (mounts, layouts) = project_mounts(&[b.clone(), a.clone()]).unwrap();
    assert_eq!(mounts.len(), 7, "{mounts:#?}");
    assert_eq!(mounts.iter().filter(|m| !m.writable).count(), 1);
    assert!(!mounts[0].writable, "the common dir comes first");
    assert_eq!(layouts.len(), 2);
    assert_ne!(layouts[0].id, layouts[1].id);
}

#[test]
fn a_path_overlayfs_cannot_layer_is_refused() {
    let repo = Repo::new("a,b", "task");
    let view = repo.view(&repo.task);
    let err = project_mounts(&[view]).unwrap_err().to_string();
    assert!(err.contains("cannot be shared"), "{err}");
}

fn words(v: &[OsString]) -> Vec<String> {
    v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
}

#[test]
fn command_lines_of_each_step() {
    let l = Limactl {
        path: "/nix/store/x-lima/bin/limactl".into(),
        home: "/home/u/.sandbox-lima".into(),
        start_timeout: None,
    };
    let base = "/nix/store/x-lima/bin/limactl --log-format json --tty=false";
    let cases: Vec<(Vec<OsString>, String)> = vec![
        (
            l.list_argv("sbx-app-123456"),
            format!("{base} list --format json sbx-app-123456"),
        ),
        (
            l.create_argv("sbx-app-123456", Path::new("/h/sbx.yaml")),
            format!("{base} create --name sbx-app-123456 /h/sbx.yaml"),
        ),
        (
            l.start_argv("sbx-app-123456"),
            format!("{base} start sbx-app-123456"),
        ),
        (
            Limactl {
                start_timeout: Some("30m".into()),
                ..l.clone()
            }
            .start_argv("sbx-app-123456"),
            format!("{base} start --timeout 30m sbx-app-123456"),
        ),
        (
            l.stop_argv("sbx-app-123456"),
            format!("{base} stop sbx-app-123456"),
        ),
        (
            l.delete_argv("sbx-app-123456"),
            format!("{base} delete --force sbx-app-123456"),
        ),
        (
            l.validate_argv(Path::new("/h/sbx.yaml")),
            format!("{base} validate /h/sbx.yaml"),
        ),
        (
            l.console_argv("sbx-app-123456"),
            "/nix/store/x-lima/bin/limactl shell --workdir / sbx-app-123456".into(),
        ),
    ];
    for (argv, want) in cases {
        assert_eq!(words(&argv).join(" "), want);
    }
    let env = l.env();
    assert!(env.contains(&("LIMA_HOME".into(), "/home/u/.sandbox-lima".into())));

    // A command: limactl shell --workdir <view dir> <instance> -- enter <id> <dir> env … argv.
    let repo = Repo::new("app", "app-task");
    let view = repo.view(&repo.task);
    let (_, layouts) = project_mounts(std::slice::from_ref(&view)).unwrap();
    let dir = sandbox_lima::backend::view_dir(&repo.task, &view.view_path, &repo.task.join("src"));
    assert_eq!(dir, view.view_path.join("src"));
    let env: Vec<(OsString, OsString)> = vec![
        ("PATH".into(), "/usr/bin".into()),
        ("HOME".into(), "/home/u".into()),
        ("SANDBOX_API_URL".into(), "http://127.0.0.1:7777".into()),
        ("SANDBOX_API_TOKEN".into(), "sbx_scoped".into()),
        ("TERM".into(), "xterm".into()),
    ];
    let argv = sandbox_lima::backend::command_argv(
        &l,
        "sbx-app-123456",
        &layouts[0],
        &dir,
        &env,
        &["make".into(), "a b".into()],
    );
    let w = words(&argv);
    let d = dir.to_string_lossy().into_owned();
    assert_eq!(
        w,
        vec![
            "/nix/store/x-lima/bin/limactl",
            "shell",
            "--workdir",
            &d,
            "sbx-app-123456",
            "--",
            sandbox_lima::provision::ENTER_SHELL,
            sandbox_lima::provision::ENTER,
            &layouts[0].id,
            &d,
            "env",
            "SANDBOX_API_URL=http://host.lima.internal:7777",
            "SANDBOX_API_TOKEN=sbx_scoped",
            "TERM=xterm",
            "make",
            "a b",
        ]
    );
}

#[test]
fn provisioning_script_is_valid_shell_and_names_its_sentinel() {
    let repo = Repo::new("with space/app", "it's dir/task");
    let view = repo.view(&repo.task);
    let (_, layouts) = project_mounts(&[view]).unwrap();
    let script = sandbox_lima::provision::script(&layouts);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.sh");
    std::fs::write(&file, &script).unwrap();
    let out = std::process::Command::new("bash")
        .arg("-n")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sentinel = sandbox_lima::provision::sentinel_of(&script).unwrap();
    assert_eq!(sentinel.len(), 32);
    // Idempotent by construction: the same views give the same script and sentinel.
    assert_eq!(sandbox_lima::provision::script(&layouts), script);
    assert!(script.contains("MaxSessions"));
    assert!(script.contains("safe.directory"));
    assert!(script.contains("mount -t overlay"));
    // Its upper layer is a virtiofs share: trusted.* xattrs do not pass, user.* do.
    assert!(
        script.contains("workdir=$4/work,userxattr\""),
        "the overlay is mounted userxattr"
    );
    // The helper inside it is valid sh too.
    let enter = script
        .split("<<'SANDBOX_ENTER'\n")
        .nth(1)
        .unwrap()
        .split("SANDBOX_ENTER\n")
        .next()
        .unwrap();
    std::fs::write(dir.path().join("enter"), enter).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-n")
        .arg(dir.path().join("enter"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sh -n enter: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--cpus` and `--memory` (the policy's limits) size the VM in the contract's forms, where
/// the project's own overrides do not; the overrides win.
#[test]
fn the_runs_limits_size_the_vm() {
    use sandbox_policy::{Limit, LimitSource, Limits};
    let limit = |value| {
        Some(Limit {
            value,
            source: LimitSource::Flag,
        })
    };
    let limits = Limits {
        memory: limit(3 << 30),
        cpu_millis: limit(1500),
        ..Limits::default()
    };
    let o = Overrides::default().with_limits(&limits);
    let (y, _repo) = generated(Platform::Linux, &ImageChoice::Ubuntu, &o);
    assert_eq!(
        (y.cpus, y.memory.as_str()),
        (2, "3GiB"),
        "a VM has whole CPUs"
    );
    let text = y.to_yaml();
    assert!(
        text.contains("cpus: 2") && text.contains("memory: 3GiB"),
        "{text}"
    );
    assert!(documented("cpus") && documented("memory"));
    assert!(CONTRACT.contains("memory: null") && CONTRACT.contains("\"4GiB\""));
    let odd = Limits {
        memory: limit(1536 << 20),
        ..Limits::default()
    };
    let m = Overrides::default().with_limits(&odd).memory.unwrap();
    assert_eq!(m, "1536MiB");
    assert_eq!(yaml::parse_size(&m), Some(1536 << 20));
    let mine = Overrides::parse("cpus: 6\n").unwrap().with_limits(&limits);
    assert_eq!(mine.cpus, Some(6), "the project's overrides win");
}

#[test]
fn overrides_are_validated_and_recreate_is_judged() {
    assert!(Overrides::parse("cpus: 4\nmemory: 8GiB\n").is_ok());
    let e = Overrides::parse("mounts:\n- location: \"~\"\n").unwrap_err();
    assert!(e.contains("mounts cannot be added"), "{e}");
    assert!(Overrides::parse("vmType: wsl2\n").is_err());
    assert!(Overrides::parse("memory: lots\n").is_err());
    let (base, _r) = generated(Platform::Linux, &ImageChoice::Ubuntu, &Overrides::default());
    let mut next = base.clone();
    next.cpus = 8;
    next.disk = "20GiB".into();
    let c = yaml::changes(&base, &next);
    assert_eq!(c.len(), 2);
    assert!(c.iter().all(|c| !c.needs_recreate), "{c:?}");
    next.disk = "5GiB".into();
    next.vm_type = "vz".into();
    let recreate: Vec<&str> = yaml::changes(&base, &next)
        .iter()
        .filter(|c| c.needs_recreate)
        .map(|c| c.key)
        .collect();
    assert_eq!(recreate, vec!["vmType", "disk"]);
}

#[test]
fn instance_names_and_home_fit_the_socket_limit() {
    let name = sandbox_lima::vm::instance_name(
        "My Very Long Project Name With Spaces",
        Path::new("/x/.git"),
    );
    assert!(name.len() <= sandbox_lima::vm::MAX_INSTANCE, "{name}");
    assert!(
        name.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "{name}"
    );
    let home = PathBuf::from("/Users/someone/.sandbox-lima");
    let longest = home.join(&name).join("ssh.sock.0123456789abcdef");
    assert!(longest.as_os_str().len() < 104);
    sandbox_lima::vm::check_home(&home).unwrap();
    let long = PathBuf::from(format!("/{}", "x".repeat(60)));
    assert!(sandbox_lima::vm::check_home(&long).is_err());
    // A global default/override file in LIMA_HOME (it could add mounts) is refused.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("_config")).unwrap();
    sandbox_lima::vm::check_home(dir.path()).unwrap();
    std::fs::write(
        dir.path().join("_config/override.yaml"),
        "mounts: [{location: \"~\"}]\n",
    )
    .unwrap();
    assert!(sandbox_lima::vm::check_home(dir.path()).is_err());
}

/// `SANDBOX_LIMA_START_TIMEOUT` takes what `limactl start --timeout` takes and this backend
/// passes on; anything else is refused before it reaches Lima's command line.
#[test]
fn start_timeouts_taken_and_refused() {
    for ok in ["90s", "30m", "1h", "600s"] {
        assert!(sandbox_lima::limactl::is_start_timeout(ok), "{ok}");
    }
    for bad in [
        "",
        "m",
        "30",
        "-5m",
        "1.5h",
        "30 m",
        "30m --vm-type vz",
        "1d",
        "9999999s",
    ] {
        assert!(!sandbox_lima::limactl::is_start_timeout(bad), "{bad}");
    }
}
