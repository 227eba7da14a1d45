//! `cargo xtask guest-test`'s Lima part: the Lima backend's guest side in a booted guest, on
//! the mounts Lima makes on a Linux host, with the provisioning as the product generates it.
//! No `limactl` here: what Lima would do around the guest is replayed, each step as Lima's
//! pinned source does it (`pkg/driver/qemu/qemu.go`, `pkg/cidata/cidata.go`):
//!
//! 1. on the host, a real repository with a task worktree, its real sandbox view, and the
//!    project's plan (`LimaSettings::plan`: the YAML `sandbox lima config` prints, its mounts
//!    and provisioning script);
//! 2. for each of the YAML's mounts, the Rust `virtiofsd` started as Lima starts it
//!    (`--socket-path <sock> --shared-dir <location>`, nothing else), and QEMU given Lima's
//!    devices for it (`vhost-user-fs-pci,queue-size=1024,tag=lima-<hash>`, guest memory from a
//!    shared `memory-backend-file` on `/dev/shm`);
//! 3. in the guest, each share mounted where Lima's boot scripts mount it (`-t virtiofs`, `ro`
//!    or `rw`), `/` made shared as systemd makes it, and the generated provisioning run as
//!    root (twice: it is idempotent) — with `mount`/`umount` from busybox (the image has no
//!    util-linux `mount`), and stand-ins for `sudo` (the command runs as root already),
//!    `sshd` and `systemctl` (no sshd, no systemd: `sshd -T` and the reload do nothing),
//!    the only parts of an Ubuntu guest it lacks;
//! 4. the git workflow inside through the generated `enter` helper, as the backend's commands
//!    run (commit, branch, delete refs, `git gc`, `git fsck`), with the host's quarantine
//!    attached to the view's layer and the view's watcher running, as during a command;
//! 5. on the host: the task branch moved (`s/<branch>`, then `<branch>` by the watcher),
//!    the deletions read from the layer's whiteouts, `main` kept, `git fsck` clean.
//!
//! What only a real `limactl` can show (cloud-init, sshd, `limactl shell`, Lima's own choice
//! of virtiofsd) is listed in docs/lima.md.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use sha2::{Digest as _, Sha256};

use sandbox_git::quarantine::StoreQuarantine;
use sandbox_git::ViewManager;
use sandbox_lima::LimaSettings;

use super::{BootOptions, Guest, GuestCommand, Image, Kernel, User};

/// The kernel the part boots: Debian 12's backports kernel (6.12), the closest of the image's
/// to what Lima's Ubuntu 24.04 guest runs (6.8).
pub const KERNEL_SUITE: &str = "bookworm-backports";

/// What the part found.
pub struct Outcome {
    pub pass: bool,
    pub summary: String,
    pub detail: String,
}

/// The Rust virtiofsd: `SANDBOX_VIRTIOFSD`, else `virtiofsd` on `PATH` or in `/usr/libexec`,
/// else the one Lima would pick from its vhost-user descriptions.
fn virtiofsd() -> Result<PathBuf> {
    let from_env = std::env::var_os("SANDBOX_VIRTIOFSD")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let on_path = || {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .chain([PathBuf::from("/usr/libexec")])
            .map(|d| d.join("virtiofsd"))
            .find(|p| p.is_file())
    };
    let candidate = from_env.or_else(on_path);
    if let Some(exe) = candidate {
        let help = Command::new(&exe)
            .arg("--help")
            .output()
            .with_context(|| format!("running {} --help", exe.display()))?;
        ensure!(
            String::from_utf8_lossy(&help.stdout).contains("--shared-dir"),
            "{} is not the Rust virtiofsd (no --shared-dir in its --help)",
            exe.display()
        );
        return Ok(exe);
    }
    sandbox_lima::virtiofs::find(&sandbox_lima::virtiofs::search_dirs_here())
        .map(|v| v.binary)
        .context(
            "the Rust virtiofsd is needed to share the view with the guest as Lima does \
             (cargo install virtiofsd, with libseccomp-dev and libcap-ng-dev; or set \
             SANDBOX_VIRTIOFSD)",
        )
}

/// Lima's mount tag (`limayaml.MountTag`): `lima-` and the first 8 bytes of the SHA-256 of
/// `location:mountPoint`, in hex.
pub fn mount_tag(location: &Path, mount_point: &Path) -> String {
    let digest = Sha256::digest(format!("{}:{}", location.display(), mount_point.display()));
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("lima-{hex}")
}

/// The virtiofsd daemons of one boot, killed (and reaped) when dropped.
struct Daemons(Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for child in &mut self.0 {
            // Each is a child this module started; they also exit when QEMU goes.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "host")
        .env("GIT_AUTHOR_EMAIL", "host@example.com")
        .env("GIT_COMMITTER_NAME", "host")
        .env("GIT_COMMITTER_EMAIL", "host@example.com")
        .output()
        .with_context(|| format!("running git {args:?}"))?;
    ensure!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Whether `name` exists in the repository at `dir`.
fn has_ref(dir: &Path, name: &str) -> bool {
    Command::new("git")
        .current_dir(dir)
        .args(["rev-parse", "--verify", "-q", name])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The guest's PATH for the replay: the stand-ins first.
const REPLAY_PATH: &str =
    "/run/lima-replay/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Stand-ins for what an Ubuntu guest has and this image lacks.
const REPLAY_SETUP: &str = r#"set -eu
mkdir -p /run/lima-replay/bin /etc/ssh/sshd_config.d
cd /run/lima-replay/bin
printf '#!/bin/sh\nexec busybox mount "$@"\n' >mount
printf '#!/bin/sh\nexec busybox umount "$@"\n' >umount
# The command runs as root already: sudo's options are dropped, the command run.
printf '#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in -n|--preserve-env) shift ;; *) break ;; esac; done\nexec "$@"\n' >sudo
# No sshd and no systemd: sshd -T reports the defaults (nothing), its reload is a no-op.
printf '#!/bin/sh\nexit 0\n' >systemctl
printf '#!/bin/sh\nexit 0\n' >sshd
chmod 755 mount umount sudo systemctl sshd
# As systemd leaves it on an Ubuntu guest: every mount shared.
busybox mount --make-rshared /
"#;

/// Boots `kernel` with one virtiofsd per mount of `mounts`, started as Lima starts it
/// (`--socket-path`, `--shared-dir`, nothing else): the daemon itself, or when `xattr` the
/// wrapper docs/lima.md describes (it adds `--xattr`); returns the guest, the daemons, and the
/// guest's mount commands (Lima's).
fn boot_with(
    run: &Path,
    image: &Image,
    kernel: &Kernel,
    virtiofsd: &Path,
    mounts: &[sandbox_lima::mounts::LimaMount],
    instance_dir: &Path,
    xattr: bool,
) -> Result<(Guest, Daemons, String)> {
    let name = if xattr { "xattr" } else { "plain" };
    let mut boot = BootOptions::new(run.join(format!("guest-{name}")));
    boot.memory_mib = 2048;
    boot.qemu_args.extend([
        "-object".into(),
        format!(
            "memory-backend-file,id=virtiofs-shm,size={}M,mem-path=/dev/shm,share=on",
            boot.memory_mib
        ),
        "-numa".into(),
        "node,memdev=virtiofs-shm".into(),
    ]);
    // The binary Lima would start: the daemon itself, or the wrapper docs/lima.md gives,
    // which the product's own check (`sandbox_lima::virtiofs::find`) must accept.
    let binary = if xattr {
        let wrapper = run.join("virtiofsd-xattr");
        std::fs::write(&wrapper, sandbox_lima::virtiofs::wrapper(virtiofsd))?;
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&wrapper, mode)?;
        let described = run.join("vhost-user");
        std::fs::create_dir_all(&described)?;
        std::fs::write(
            described.join("40-virtiofsd-xattr.json"),
            serde_json::json!({"type": "fs", "binary": wrapper}).to_string(),
        )?;
        let found = sandbox_lima::virtiofs::find(&[described])
            .context("the product refuses the wrapper docs/lima.md describes")?;
        ensure!(
            found.binary == wrapper,
            "the product picked {:?}",
            found.binary
        );
        wrapper
    } else {
        virtiofsd.to_path_buf()
    };
    let mut daemons = Daemons(Vec::new());
    let mut guest_mounts = String::new();
    // Where Lima puts them: `<LIMA_HOME>/<instance>/virtiofsd-<n>.sock` (the wrapper finds
    // the backend's list of writable shares from it).
    std::fs::create_dir_all(instance_dir)?;
    let sock = |i: usize| instance_dir.join(format!("virtiofsd-{i}.sock"));
    let log = |i: usize| run.join(format!("virtiofsd-{name}-{i}.log"));
    for (i, m) in mounts.iter().enumerate() {
        let _ = std::fs::remove_file(sock(i));
        let out = std::fs::File::create(log(i))?;
        // Exactly Lima's arguments (`VirtiofsdCmdline`).
        let child = Command::new(&binary)
            .arg("--socket-path")
            .arg(sock(i))
            .arg("--shared-dir")
            .arg(&m.location)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        daemons.0.push(child);
        let tag = mount_tag(&m.location, &m.mount_point);
        boot.qemu_args.extend([
            "-chardev".into(),
            format!("socket,id=char-virtiofs-{i},path={}", sock(i).display()),
            "-device".into(),
            format!("vhost-user-fs-pci,queue-size=1024,chardev=char-virtiofs-{i},tag={tag}"),
        ]);
        // As Lima's cloud-init fstab has them (`ro`/`rw`, and `nofail`, which is mount(8)'s).
        let mode = if m.writable { "rw" } else { "ro" };
        guest_mounts.push_str(&format!(
            "mkdir -p '{mp}' && busybox mount -t virtiofs -o {mode} {tag} '{mp}'\n",
            mp = m.mount_point.display()
        ));
    }
    // Lima waits for each daemon's socket before it starts QEMU; so does this.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, child) in daemons.0.iter_mut().enumerate() {
        while !sock(i).exists() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "virtiofsd #{i} exited ({status}): {}",
                    std::fs::read_to_string(log(i)).unwrap_or_default()
                );
            }
            ensure!(
                Instant::now() < deadline,
                "virtiofsd #{i} made no socket in 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    eprintln!(
        "guest-test: lima: booting {} with {} virtiofs mounts ({})",
        kernel.release,
        mounts.len(),
        if xattr {
            "virtiofsd --xattr"
        } else {
            "virtiofsd as Lima starts it"
        }
    );
    let guest = Guest::boot(image, kernel, &boot)?;
    Ok((guest, daemons, guest_mounts))
}

/// Runs the part: boots `kernel` of `image` with the view's mounts and checks it all.
pub fn run(root: &Path, image: &Image, kernel: &Kernel) -> Result<Outcome> {
    let started = Instant::now();
    let virtiofsd = virtiofsd()?;
    let run = root.join("target/guest/run-lima");
    if run.exists() {
        // A layer's work dir may hold directories without permissions (overlayfs's).
        let _ = Command::new("chmod")
            .arg("-R")
            .arg("u+rwx")
            .arg(&run)
            .status();
        std::fs::remove_dir_all(&run).with_context(|| format!("removing {}", run.display()))?;
    }
    let base = run.join("host");
    std::fs::create_dir_all(&base)?;
    let base = std::fs::canonicalize(&base)?;

    // 1. The repository, the task worktree and its sandbox view, on the host.
    let main = base.join("app");
    std::fs::create_dir_all(&main)?;
    git(&main, &["init", "-q", "-b", "main"])?;
    std::fs::write(main.join("README.md"), "hi\n")?;
    git(&main, &["add", "."])?;
    git(&main, &["commit", "-qm", "initial"])?;
    let task = base.join("app-task");
    git(
        &main,
        &[
            "worktree",
            "add",
            "-q",
            &task.to_string_lossy(),
            "-b",
            "task",
        ],
    )?;
    let before_main = git(&main, &["rev-parse", "main"])?;
    let settings = LimaSettings {
        limactl: None,
        home: base.join("lh"),
        views_root: base.join("views"),
        runtime_dir: base.join("run"),
        nix_image: None,
        overrides_dir: base.join("overrides"),
        private_dir: base.join("private"),
        vhost_user_dirs: Vec::new(),
        start_timeout: None,
    };
    let views: ViewManager = settings.views();
    let view = views
        .create_or_reuse(&task, None)
        .context("creating the sandbox view")?
        .view;
    let plan = settings.plan(&view).context("planning the project's VM")?;
    ensure!(
        plan.yaml.vm_type == "qemu" && plan.yaml.mount_type == "virtiofs",
        "the YAML for Linux asks for vmType {} and mountType {}, not qemu and virtiofs",
        plan.yaml.vm_type,
        plan.yaml.mount_type
    );
    let layout = plan
        .layouts
        .iter()
        .find(|l| l.view_path == view.view_path)
        .context("the view is not among the plan's")?
        .clone();
    let script = plan
        .yaml
        .provision
        .first()
        .context("the YAML has no provisioning")?
        .script
        .clone();

    // The list of writable shares the backend writes when it creates the VM (`Vm::create`).
    let instance_dir = settings.home.join(&plan.instance);
    sandbox_lima::virtiofs::write_share_modes(&settings.home, &plan.instance, &plan.yaml.mounts)?;

    // 2. Lima's own invocation first: virtiofsd without --xattr. overlayfs takes a remote
    // upper layer (virtiofs) only with xattrs, so provisioning must fail closed: no sentinel,
    // and `enter` refuses (125) instead of running on a writable store.
    let mut refused = Vec::new();
    {
        let (mut guest, daemons, mounts) = boot_with(
            &run,
            image,
            kernel,
            &virtiofsd,
            &plan.yaml.mounts,
            &instance_dir,
            false,
        )?;
        let check = (|| -> Result<()> {
            let run_root = |guest: &mut Guest, script: &str| {
                guest.run(&GuestCommand {
                    argv: vec!["bash".into(), "-c".into(), script.into()],
                    user: User::Root,
                    env: vec![("PATH".into(), REPLAY_PATH.into())],
                    cwd: None,
                    timeout: Duration::from_secs(300),
                })
            };
            for (what, script) in [("stand-ins", REPLAY_SETUP), ("mounts", mounts.as_str())] {
                let out = run_root(&mut guest, script)?;
                ensure!(out.success(), "{what}: {}", out.stderr_text());
            }
            let out = run_root(&mut guest, &script)?;
            if out.success() {
                refused.push("without --xattr, provisioning succeeded".to_string());
            } else if !out.stderr_text().contains("--xattr") {
                refused.push(format!(
                    "without --xattr, provisioning failed without naming the fix: {}",
                    out.stderr_text()
                ));
            }
            // No sentinel (the backend refuses such a VM) and no overlay namespace for the view.
            let out = run_root(
                &mut guest,
                &format!(
                    "test ! -e {} && ! findmnt /run/sandbox-lima/ns/{} >/dev/null && echo refused",
                    sandbox_lima::provision::SENTINEL,
                    layout.id
                ),
            )?;
            if !out.stdout_text().contains("refused") {
                refused.push(format!(
                    "without --xattr, the sentinel was written or the view's namespace made: {}{}",
                    out.stdout_text(),
                    out.stderr_text()
                ));
            }
            Ok(())
        })();
        let _ = guest.poweroff();
        drop(daemons);
        check.context("the replay on Lima's own virtiofsd")?;
    }

    // 3. With the wrapper docs/lima.md describes (virtiofsd --xattr): the whole workflow.
    let (mut guest, daemons, guest_mounts) = boot_with(
        &run,
        image,
        kernel,
        &virtiofsd,
        &plan.yaml.mounts,
        &instance_dir,
        true,
    )?;

    let detail = std::cell::RefCell::new(String::new());
    let sh = |guest: &mut Guest, what: &str, argv: Vec<String>| -> Result<String> {
        let out = guest.run(&GuestCommand {
            argv,
            user: User::Root,
            env: vec![("PATH".into(), REPLAY_PATH.into())],
            cwd: None,
            timeout: Duration::from_secs(300),
        })?;
        detail.borrow_mut().push_str(&format!(
            "--- {what}: {}\n{}{}",
            out.status_text(),
            out.stdout_text(),
            out.stderr_text()
        ));
        ensure!(
            out.success(),
            "{what} failed in the guest ({}): {}{}",
            out.status_text(),
            out.stdout_text(),
            out.stderr_text()
        );
        Ok(out.stdout_text())
    };
    let bash = |s: &str| vec!["bash".to_string(), "-c".to_string(), s.to_string()];

    // Lima's mounts, then the provisioning as generated (twice: it is idempotent).
    let result = (|| -> Result<Outcome> {
        sh(&mut guest, "the replay's stand-ins", bash(REPLAY_SETUP))?;
        sh(&mut guest, "Lima's virtiofs mounts", bash(&guest_mounts))?;
        sh(&mut guest, "provisioning", bash(&script))?;
        sh(&mut guest, "provisioning again", bash(&script))?;
        let sentinel = sh(
            &mut guest,
            "the sentinel",
            bash(&format!("cat {}", sandbox_lima::provision::SENTINEL)),
        )?;
        ensure!(
            Some(sentinel.trim().to_owned()) == sandbox_lima::provision::sentinel_of(&script),
            "the sentinel holds {sentinel:?}, not the script's hash"
        );

        // 4. The git workflow through `enter`, with the host's quarantine and watcher on.
        let enter = |script: &str| -> Vec<String> {
            let mut argv: Vec<String> = vec![
                sandbox_lima::provision::ENTER_SHELL.into(),
                sandbox_lima::provision::ENTER.into(),
                layout.id.clone(),
                view.view_path.display().to_string(),
                "env".into(),
            ];
            for (k, v) in [
                ("GIT_AUTHOR_NAME", "vm"),
                ("GIT_AUTHOR_EMAIL", "vm@example.com"),
                ("GIT_COMMITTER_NAME", "vm"),
                ("GIT_COMMITTER_EMAIL", "vm@example.com"),
            ] {
                argv.push(format!("{k}={v}"));
            }
            argv.extend(["sh".into(), "-c".into(), script.into()]);
            argv
        };
        let (tx, events) = std::sync::mpsc::channel();
        let _watcher = views
            .watch(vec![view.clone()], move |e| {
                let _ = tx.send(e.describe());
            })
            .context("starting the view's watcher")?;
        let q = StoreQuarantine::attach(
            &view.common_dir,
            Some(&view.child_ref()),
            &layout.layer_dir,
            &base.join("private"),
        )
        .context("attaching the host's quarantine to the view's layer")?;
        let one = sh(
            &mut guest,
            "session 1 (commit, branch)",
            enter(
                "set -e; echo one >one; git add one; git commit -qm one; git branch feature; \
                 git rev-parse HEAD",
            ),
        )?;
        let one = one.trim().to_owned();
        q.sync(false)
            .context("reading the layer back after session 1")?;
        let child = view.child_ref();
        ensure!(
            git(&main, &["rev-parse", &child])? == one,
            "{child} did not move to the VM's commit {one}: {:?}",
            q.report()
        );
        ensure!(
            has_ref(&main, "refs/heads/feature"),
            "the VM's new branch was not applied: {:?}",
            q.report()
        );
        let two = sh(
            &mut guest,
            "session 2 (delete refs, commit, gc, fsck)",
            enter(
                "set -e; git branch -q -D feature; git update-ref -d refs/heads/main; \
                 echo two >two; git add two; git commit -qm two; git gc -q --prune=now; \
                 git fsck --strict --no-dangling; git rev-parse HEAD",
            ),
        )?;
        let two = two.trim().to_owned();
        let whiteouts = sh(
            &mut guest,
            "the layer's whiteouts",
            bash(&format!(
                "find '{}' -type c | wc -l",
                layout.layer_dir.join("upper").display()
            )),
        )?;
        q.sync(true)
            .context("reading the layer back after session 2")?;
        let report = q.report();
        // From the attacker's side, as root in the guest (the Lima user has sudo): the common
        // dir's mount is remounted writable. Lima cannot make a virtiofs share read-only; the
        // wrapper's --readonly (the share is not listed writable) must hold on the host.
        let common = view.common_dir.display().to_string();
        let planted = view.common_dir.join("hooks/planted-by-the-vm");
        let _ = sh(
            &mut guest,
            "remounting the common dir rw (an attack)",
            bash(&format!(
                "busybox mount -o remount,rw '{common}' && echo x >'{}'; true",
                planted.display()
            )),
        );
        let read_only_holds = !planted.exists();

        // 5. On the host.
        let mut failures = refused.clone();
        if git(&main, &["rev-parse", &child])? != two {
            failures.push(format!("{child} is not the VM's last commit {two}"));
        }
        if has_ref(&main, "refs/heads/feature") {
            failures.push("the VM's deleted branch is still on the host".into());
        }
        if git(&main, &["rev-parse", "main"])? != before_main {
            failures.push("main moved or was deleted".into());
        }
        let refused_names: Vec<&str> = report.refused.iter().map(|r| r.name.as_str()).collect();
        if refused_names != ["refs/heads/main"] {
            failures.push(format!(
                "refused {refused_names:?}, not exactly the deletion of main"
            ));
        }
        if !report.rejected_objects.is_empty() {
            failures.push(format!(
                "objects were rejected: {:?}",
                report.rejected_objects
            ));
        }
        let whiteouts: u32 = whiteouts.trim().parse().unwrap_or(0);
        if whiteouts == 0 {
            failures.push("the layer holds no whiteout".into());
        }
        if let Err(e) = git(&main, &["fsck", "--strict", "--no-dangling"]) {
            failures.push(format!("git fsck on the host: {e:#}"));
        }
        // The watcher carries s/<branch> to <branch>: wait for its event.
        let deadline = Instant::now() + Duration::from_secs(60);
        while git(&main, &["rev-parse", &view.branch_ref()])? != two {
            let left = deadline.saturating_duration_since(Instant::now());
            if events.recv_timeout(left).is_err() {
                failures.push(format!("the watcher did not move {}", view.branch));
                break;
            }
        }
        detail
            .borrow_mut()
            .push_str(&format!("--- host: {report:?}\n"));
        if !read_only_holds {
            failures.push(
                "root in the guest remounted the read-only common dir rw and wrote hooks/ on \
                 the host"
                    .into(),
            );
        }
        Ok(Outcome {
            pass: failures.is_empty(),
            summary: if failures.is_empty() {
                format!(
                    "{} virtiofs mounts; on Lima's own virtiofsd (no --xattr) provisioning \
                     fails closed; with --xattr it holds, and commit, branch, delete, gc, fsck \
                     inside; {} whiteouts read as deletions, {} moved, main kept, fsck clean, the \
                     common dir read-only to root inside \
                     ({:.0} s)",
                    plan.yaml.mounts.len(),
                    whiteouts,
                    view.branch,
                    started.elapsed().as_secs_f64()
                )
            } else {
                failures.join("; ")
            },
            detail: String::new(),
        })
    })();
    let console = guest.console_tail();
    let _ = guest.poweroff();
    drop(daemons);
    let detail = detail.into_inner();
    match result {
        Ok(mut outcome) => {
            outcome.detail = detail;
            Ok(outcome)
        }
        Err(e) => Ok(Outcome {
            pass: false,
            summary: format!("{e:#}").lines().next().unwrap_or("").to_owned(),
            detail: format!("{e:#}\n{detail}\n--- console\n{console}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lima's own: `MountTag("/Users/foo", "/Users/foo")` (pkg/limayaml/defaults.go), the
    /// SHA-256 of "/Users/foo:/Users/foo" cut to 8 bytes.
    #[test]
    fn mount_tags_are_limas() {
        let tag = mount_tag(Path::new("/Users/foo"), Path::new("/Users/foo"));
        let digest = Sha256::digest(b"/Users/foo:/Users/foo");
        let want: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(tag, format!("lima-{want}"));
        assert_eq!(tag.len(), "lima-".len() + 16);
    }
}
