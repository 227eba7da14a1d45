//! Against the real `limactl`, where one is installed (`SANDBOX_LIMACTL`, the package's,
//! `PATH`): `limactl validate` of the generated YAML, and the whole lifecycle where a VM can
//! boot. Elsewhere each test prints `skipped: <reason>`.

use std::path::PathBuf;

use sandbox_lima::mounts::project_mounts;
use sandbox_lima::yaml::{self, ImageChoice, Inputs, Overrides, Platform};
use sandbox_lima::Limactl;

use crate::common::{skip, Repo};

/// `limactl` exits at once as root (`cmd/limactl/main.go`); CI's suite runs as root.
fn as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

const ROOT: &str = "limactl refuses to run as root; cargo xtask lima-test runs the real limactl as a user of its own";

fn real_limactl() -> Option<PathBuf> {
    let from = |v: &str| {
        std::env::var_os(v)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    from("SANDBOX_LIMACTL")
        .or_else(|| from("SANDBOX_PACKAGE_LIMACTL"))
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|d| d.join("limactl"))
                .find(|p| p.is_file())
        })
}

#[test]
fn limactl_validate_accepts_the_generated_yaml() {
    let Some(path) = real_limactl() else {
        return skip("limactl", "limactl is not installed here (set SANDBOX_LIMACTL); the YAML is checked against Lima's documented schema instead (contract tests)");
    };
    if as_root() {
        return skip("limactl", ROOT);
    }
    let repo = Repo::new("app", "app-task");
    let view = repo.view(&repo.task);
    let (mounts, layouts) = project_mounts(&[view]).unwrap();
    let y = yaml::generate(&Inputs {
        platform: Platform::here(),
        arch: yaml::host_arch(),
        image: &ImageChoice::Ubuntu,
        mounts: &mounts,
        views: &layouts,
        overrides: &Overrides::default(),
    });
    let file = repo.base.join("sbx.yaml");
    std::fs::write(&file, y.to_yaml()).unwrap();
    let l = Limactl {
        path,
        home: repo.base.join("lh"),
        start_timeout: None,
    };
    l.check_version().unwrap();
    let (code, _, lines) = l.output(&l.validate_argv(&file)).unwrap();
    assert_eq!(code, 0, "limactl validate: {lines:?}");
}

#[test]
fn full_lifecycle_boots_where_a_vm_can() {
    if real_limactl().is_none() {
        return skip("limactl", "limactl is not installed here; the lifecycle runs against the stand-in (standin tests)");
    }
    if as_root() {
        return skip("limactl", ROOT);
    }
    if std::env::var_os("SANDBOX_LIMA_BOOT_TESTS").is_none() {
        return skip("lima-boot", "booting a VM takes minutes and needs working hardware virtualisation; set SANDBOX_LIMA_BOOT_TESTS=1 to run it");
    }
    let repo = Repo::new("app", "app-task");
    let settings = sandbox_lima::LimaSettings {
        limactl: real_limactl(),
        home: repo.base.join("lh"),
        views_root: repo.base.join("views"),
        runtime_dir: repo.base.join("run"),
        nix_image: std::env::var_os("SANDBOX_PACKAGE_LIMA_IMAGE").map(PathBuf::from),
        overrides_dir: repo.base.join("overrides"),
        private_dir: repo.base.join("private"),
        vhost_user_dirs: sandbox_lima::virtiofs::search_dirs_here(),
        start_timeout: None,
    };
    settings.ensure_home().unwrap();
    let view = repo.view(&repo.task);
    let p = settings.project(&view).unwrap();
    p.vm.ensure_running(&p.yaml, &mut |e| eprintln!("{e:?}"))
        .unwrap();
    p.vm.check_workdir(&view.view_path).unwrap();
    p.vm.delete(&mut |_| {}).unwrap();
}
