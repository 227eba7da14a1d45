//! The virtiofsd Lima would start, found the way Lima's QEMU driver finds it: real
//! descriptions in real directories, real binaries (the system's C virtiofsd where QEMU ships
//! one; scripts standing in for a daemon's answers to `--version` and `--help` otherwise).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sandbox_lima::mounts::LimaMount;
use sandbox_lima::virtiofs::{find, search_dirs, wrapper, write_share_modes};

fn daemon(dir: &Path, name: &str, help: &str) -> PathBuf {
    let exe = dir.join(name);
    std::fs::write(
        &exe,
        // Like the daemons, it takes its options in any order.
        format!(
            "#!/bin/sh\nfor a; do case \"$a\" in --version) echo {name}; exit ;; \
             --help) echo '{help}'; exit ;; esac; done\nexit 1\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

fn describe(dir: &Path, file: &str, kind: &str, binary: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(file),
        serde_json::json!({"type": kind, "binary": binary}).to_string(),
    )
    .unwrap();
}

#[test]
fn lima_looks_in_home_then_qemus_prefix_then_usr() {
    let dirs = search_dirs(
        Some(Path::new("/home/u")),
        Some(Path::new("/opt/qemu/bin/qemu-system-x86_64")),
    );
    assert_eq!(
        dirs,
        [
            "/home/u/.local/share/qemu/vhost-user",
            "/opt/qemu/share/qemu/vhost-user",
            "/usr/share/qemu/vhost-user"
        ]
        .map(PathBuf::from)
    );
    // QEMU in /usr/bin: /usr is searched once.
    let dirs = search_dirs(None, Some(Path::new("/usr/bin/qemu-system-x86_64")));
    assert_eq!(dirs, [PathBuf::from("/usr/share/qemu/vhost-user")]);
}

#[test]
fn the_first_fs_backend_that_runs_is_the_one_judged() {
    let tmp = tempfile::tempdir().unwrap();
    let (home, usr) = (tmp.path().join("home"), tmp.path().join("usr"));
    std::fs::create_dir_all(&home).unwrap();
    let rust_help = "Usage: virtiofsd --shared-dir <SHARED_DIR> --socket-path <SOCKET_PATH>";
    let rust = daemon(tmp.path(), "virtiofsd", rust_help);
    // The wrapper docs/lima.md gives: the daemon run with --xattr.
    let wrapper = tmp.path().join("virtiofsd-xattr");
    std::fs::write(&wrapper, sandbox_lima::virtiofs::wrapper(&rust)).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Nothing described: refused, naming where it looked.
    let err = find(&[home.clone(), usr.clone()]).unwrap_err().to_string();
    assert!(err.contains("virtiofs is not available"), "{err}");
    assert!(err.contains(&home.display().to_string()), "{err}");
    assert!(err.contains("cargo install virtiofsd"), "{err}");

    // A description of another kind, and one whose binary does not run, are passed over.
    describe(&home, "10-gpu.json", "gpu", &rust);
    describe(&home, "20-gone.json", "fs", &tmp.path().join("missing"));
    // The daemon itself, as its package describes it: Lima would start it without --xattr.
    describe(&usr, "50-virtiofsd.json", "fs", &rust);
    let err = find(&[home.clone(), usr.clone()]).unwrap_err().to_string();
    assert!(err.contains("carry no xattrs"), "{err}");
    assert!(err.contains(&rust.display().to_string()), "{err}");
    assert!(err.contains("virtiofsd-xattr"), "the fix: {err}");
    // The wrapper, described first (40- sorts before 50-): it is the one.
    describe(&usr, "40-virtiofsd-xattr.json", "fs", &wrapper);
    let found = find(&[home.clone(), usr.clone()]).unwrap();
    assert_eq!(found.binary, wrapper);
    assert_eq!(found.description, usr.join("40-virtiofsd-xattr.json"));

    // QEMU's C virtiofsd found first (it answers --version): Lima would pick it and fail, so
    // the host is refused, naming it — even though a usable one is described later.
    let c_daemon = Path::new("/usr/lib/qemu/virtiofsd");
    let c_daemon = if c_daemon.is_file() {
        c_daemon.to_path_buf()
    } else {
        daemon(
            tmp.path(),
            "qemu-virtiofsd",
            "usage: virtiofsd [options] -o source=PATH",
        )
    };
    describe(&home, "30-qemu-virtiofsd.json", "fs", &c_daemon);
    let err = find(&[home.clone(), usr.clone()]).unwrap_err().to_string();
    assert!(err.contains(&c_daemon.display().to_string()), "{err}");
    assert!(err.contains("not the Rust virtiofsd"), "{err}");
}

/// The wrapper itself, run as Lima runs it (`--socket-path <home>/<instance>/virtiofsd-<n>.sock
/// --shared-dir <location>`) over a daemon that prints what it was given: `--xattr` always; in
/// a sandbox's LIMA_HOME `--readonly` for every share the backend did not list writable (none
/// listed: all read-only); in another Lima's home, no `--readonly`.
#[test]
fn the_wrapper_makes_every_share_read_only_but_the_listed_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = tmp.path().join("daemon");
    std::fs::write(&daemon, "#!/bin/sh\necho \"$*\"\n").unwrap();
    std::fs::set_permissions(&daemon, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = tmp.path().join("virtiofsd-xattr");
    std::fs::write(&script, wrapper(&daemon)).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |home: &Path, dir: &str| {
        let sock = home.join("sbx-app-1/virtiofsd-0.sock");
        let out = std::process::Command::new(&script)
            .arg("--socket-path")
            .arg(&sock)
            .args(["--shared-dir", dir])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let home = tmp.path().join("sandbox-lima");
    let mount = |location: &str, writable| LimaMount {
        location: location.into(),
        mount_point: location.into(),
        writable,
    };
    write_share_modes(
        &home,
        "sbx-app-1",
        &[mount("/repo/.git", false), mount("/views/app task", true)],
    )
    .unwrap();
    let sock = home.join("sbx-app-1/virtiofsd-0.sock");
    assert_eq!(
        run(&home, "/repo/.git"),
        format!(
            "--xattr --readonly --socket-path {} --shared-dir /repo/.git",
            sock.display()
        )
    );
    assert_eq!(
        run(&home, "/views/app task"),
        format!(
            "--xattr --socket-path {} --shared-dir /views/app task",
            sock.display()
        )
    );
    assert!(
        run(&home, "/views/app").contains("--readonly"),
        "a prefix is not a listing"
    );
    std::fs::remove_file(home.join("_sandbox/sbx-app-1.writable")).unwrap();
    assert!(
        run(&home, "/views/app task").contains("--readonly"),
        "nothing listed: read-only"
    );
    // Another Lima's home (no _sandbox/): xattrs only.
    let other = tmp.path().join("lima");
    assert!(!run(&other, "/repo/.git").contains("--readonly"));
}
