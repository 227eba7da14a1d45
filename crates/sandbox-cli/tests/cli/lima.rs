//! `sandbox run --backend lima` and `sandbox lima …` end to end, against the `limactl`
//! stand-in of sandbox-lima's tests (it records argv and LIMA_HOME and plays back Lima's real
//! output): the view, the VM's lifecycle, the command line and the exit code pass-through.
//! A booted VM cannot be had here (docs/backends.md, "lima"); sandbox-lima's `real` tests run one where it can.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::daemon::{req, Daemon};
use common::{text, Env};
use sandbox_protocol::{BoxState, Incoming};
use sandbox_service::Client;
use sandbox_testkit::limactl::Standin;
use serde_json::json;

struct Lima {
    env: Env,
    standin: Standin,
    task: PathBuf,
}

impl Lima {
    fn new() -> Self {
        let env = Env::new();
        let base = std::fs::canonicalize(env.path()).unwrap();
        let main = base.join("app");
        std::fs::create_dir_all(&main).unwrap();
        std::fs::write(main.join("README.md"), "hi\n").unwrap();
        let task = base.join("app-task");
        sandbox_testkit::linked_worktree(&main, &task);
        let standin = Standin::install(&base.join("standin"));
        standin.register_virtiofsd(&env.home());
        Lima { env, standin, task }
    }

    fn cmd(&self) -> Command {
        let mut c = self.env.cmd();
        c.env("SANDBOX_LIMACTL", self.standin.exe())
            .env("SANDBOX_LIMA_HOME", self.env.path().join("lh"))
            .current_dir(&self.task);
        c
    }

    fn calls(&self) -> String {
        self.standin.calls()
    }
}

#[test]
fn run_creates_the_vm_and_passes_the_exit_code_through() {
    let l = Lima::new();
    std::fs::write(l.standin.dir.join("shell-exit"), "7").unwrap();
    let out = l
        .cmd()
        .args(["run", "--backend", "lima", "--", "make", "test"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    let calls = l.calls();
    let home = format!("LIMA_HOME={}", l.env.path().join("lh").display());
    assert!(calls.lines().all(|c| c.starts_with(&home)), "{calls}");
    assert!(calls.contains(" create --name sbx-app-"), "{calls}");
    assert!(calls.contains(" start sbx-app-"), "{calls}");
    // The command: limactl shell --workdir <view> <instance> -- enter <id> <view> env … make test.
    let last = calls.lines().last().unwrap();
    let view = l
        .env
        .path()
        .join("home/.local/share/sandbox/views/app/app-task-sandbox");
    let view = std::fs::canonicalize(view).unwrap();
    assert!(
        last.contains(&format!("shell --workdir {}", view.display())),
        "{last}"
    );
    assert!(last.contains("/run/sandbox-lima/enter"), "{last}");
    assert!(
        last.ends_with(" SANDBOX_BACKEND=lima SANDBOX_TASK=app-task make test"),
        "{last}"
    );
    assert!(!last.contains("SANDBOX_HOST_TOKEN"), "{last}");

    // The second run reuses the running VM: no create, no start.
    l.standin.clear_calls();
    std::fs::write(l.standin.dir.join("shell-exit"), "0").unwrap();
    let out = l
        .cmd()
        .args(["run", "--backend", "lima", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let calls = l.calls();
    assert!(
        !calls.contains(" create ") && !calls.contains(" start "),
        "{calls}"
    );
}

#[test]
fn a_failed_boot_is_125_and_names_the_step_and_log() {
    let l = Lima::new();
    l.standin.mode("create", "download-fails");
    let out = l
        .cmd()
        .args(["run", "--backend", "lima", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("could not be downloaded") && t.contains("ha.stderr.log"),
        "{t}"
    );
    // Nothing ran in the VM.
    assert!(!l.calls().contains("/run/sandbox-lima/enter"));
}

/// On Linux a QEMU VM's mounts are virtiofs, served by a virtiofsd Lima starts: where the one
/// Lima would pick cannot serve them (QEMU's own C virtiofsd, as Debian 12 ships it), the run
/// is refused before any VM is made — exit 125, naming the fix — never left on 9p.
#[test]
fn a_host_without_a_usable_virtiofsd_is_refused_before_a_vm_is_made() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let l = Lima::new();
    // Described first (HOME's), so it is the one Lima would pick: the real C virtiofsd where
    // QEMU ships one, else a daemon like it (it answers --version, takes no --shared-dir).
    let c_daemon = PathBuf::from("/usr/lib/qemu/virtiofsd");
    let binary = if c_daemon.is_file() {
        c_daemon
    } else {
        let script = l.env.path().join("c-virtiofsd");
        std::fs::write(
            &script,
            "#!/bin/sh
echo 'virtiofsd version 7.2.0'
",
        )
        .unwrap();
        std::os::unix::fs::PermissionsExt::set_mode(
            &mut std::fs::metadata(&script).unwrap().permissions(),
            0o755,
        );
        Command::new("chmod")
            .arg("755")
            .arg(&script)
            .status()
            .unwrap();
        script
    };
    let vhost = l.env.home().join(".local/share/qemu/vhost-user");
    std::fs::write(
        vhost.join("40-qemu-virtiofsd.json"),
        json!({"type": "fs", "binary": binary}).to_string(),
    )
    .unwrap();
    let out = l
        .cmd()
        .args(["run", "--backend", "lima", "--", "true"])
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(125), "{t}");
    assert!(t.contains("virtiofs is not available"), "{t}");
    assert!(t.contains(&binary.display().to_string()), "{t}");
    assert!(t.contains("Install the Rust virtiofsd"), "{t}");
    let calls = l.calls();
    assert!(
        !calls.contains(" create ") && !calls.contains(" start "),
        "no VM is made: {calls}"
    );
}

#[test]
fn a_missing_limactl_is_a_clear_setup_error() {
    let l = Lima::new();
    let out = l
        .cmd()
        .env("SANDBOX_LIMACTL", l.env.path().join("nowhere/limactl"))
        .args(["run", "--backend", "lima", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(text(&out).contains("limactl"), "{}", text(&out));
}

#[test]
fn lifecycle_commands_and_config() {
    let l = Lima::new();
    let out = l.cmd().args(["lima", "status", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"]["state"], "absent");
    assert_eq!(v["mounts"].as_array().unwrap().len(), 4);

    let out = l.cmd().args(["lima", "start", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let steps: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with("{\"event\":\"step\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = steps
        .iter()
        .filter(|s| s["step"]["state"] == "started")
        .map(|s| s["step"]["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec![
            "creating the VM",
            "downloading the image",
            "starting the VM",
            "connecting over SSH",
            "provisioning",
            "checking provisioning"
        ],
        "{stdout}"
    );

    let out = l.cmd().args(["lima", "config"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("mountType: virtiofs"));

    // --edit validates before saving: a mount is refused and the file is not written.
    let editor = l.env.path().join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nprintf 'mounts:\\n- location: \"~\"\\n' >\"$1\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = l
        .cmd()
        .env("EDITOR", &editor)
        .args(["lima", "config", "--edit"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).contains("nothing saved"), "{}", text(&out));
    std::fs::write(&editor, "#!/bin/sh\nprintf 'vmType: vz\\n' >\"$1\"\n").unwrap();
    let out = l
        .cmd()
        .env("EDITOR", &editor)
        .args(["lima", "config", "--edit"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("needs `sandbox lima recreate`"),
        "{}",
        text(&out)
    );

    let out = l.cmd().args(["lima", "recreate"]).output().unwrap();
    assert_ne!(
        out.status.code(),
        Some(0),
        "recreate without --yes and no terminal must not proceed"
    );
    let out = l
        .cmd()
        .args(["lima", "recreate", "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = l.cmd().args(["lima", "stop"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = l.cmd().args(["lima", "delete", "--yes"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(l.calls().contains(" delete --force sbx-app-"));
}

/// `box.create` with backend "lima" through a real daemon: every named step of preparing the
/// VM arrives as a `creating` boxState event, in order and before the reply, then `created`.
fn create_lima_box(l: &Lima, client: &mut Client, name: &str) -> (Vec<Incoming>, Incoming) {
    let id = client
        .send(&req(
            "box.create",
            json!({"name": name, "backend": "lima", "workdir": l.task}),
        ))
        .unwrap();
    let mut events = Vec::new();
    loop {
        let frame = client.next_frame().unwrap();
        if frame.is_reply() {
            assert_eq!(frame.id, Some(Some(id)), "{frame:?}");
            return (events, frame);
        }
        assert_eq!(frame.kind.as_deref(), Some("boxState"), "{frame:?}");
        assert_eq!(frame.name.as_deref(), Some(name), "{frame:?}");
        events.push(frame);
    }
}

/// (step, stepState) of the `creating` events.
fn steps(events: &[Incoming]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e.state == Some(BoxState::Creating))
        .map(|e| (e.step.clone().unwrap(), e.step_state.clone().unwrap()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn box_create_announces_each_vm_step_as_box_state() {
    let l = Lima::new();
    let daemon = Daemon::start_with(&l.env, l.cmd());
    let mut client = daemon.client();
    let (events, reply) = create_lima_box(&l, &mut client, "vm");
    let result = reply.result.unwrap_or_else(|| panic!("{:?}", reply.error));
    assert_eq!(result["backend"], "lima", "{result}");
    let box_id = result["boxId"].as_str().unwrap();

    assert_eq!(
        steps(&events),
        pairs(&[
            ("preparing the sandbox view", "started"),
            ("preparing the sandbox view", "done"),
            ("checking the VM", "started"),
            ("checking the VM", "done"),
            ("creating the VM", "started"),
            ("creating the VM", "done"),
            ("downloading the image", "started"),
            ("downloading the image", "done"),
            ("starting the VM", "started"),
            ("starting the VM", "done"),
            ("connecting over SSH", "started"),
            ("connecting over SSH", "done"),
            ("provisioning", "started"),
            ("provisioning", "done"),
            ("checking provisioning", "started"),
            ("checking provisioning", "done"),
            ("launching", "started"),
            ("launching", "done"),
        ]),
        "{events:#?}"
    );
    // The steps come first, then `created`, all for the box the reply names.
    let last = events.last().unwrap();
    assert_eq!(last.state, Some(BoxState::Created), "{events:#?}");
    assert!(events.iter().all(|e| e.box_id.as_deref() == Some(box_id)));
    // elapsedMs counts from the request and never goes back; a done step has its own time.
    let elapsed: Vec<u64> = events.iter().map(|e| e.elapsed_ms.unwrap()).collect();
    assert!(elapsed.windows(2).all(|w| w[0] <= w[1]), "{elapsed:?}");
    for e in &events {
        let done = e.step_state.as_deref() == Some("done");
        assert_eq!(e.step_ms.is_some(), done, "{e:?}");
    }
    // The VM really went through limactl.
    let calls = l.calls();
    assert!(calls.contains(" create --name sbx-app-"), "{calls}");
    assert!(calls.contains(" start sbx-app-"), "{calls}");

    // Another box of the same project, from another connection: the VM is running, so it
    // is only checked, not created or started again.
    l.standin.clear_calls();
    let (events, reply) = create_lima_box(&l, &mut daemon.client(), "vm2");
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(
        steps(&events),
        pairs(&[
            ("preparing the sandbox view", "started"),
            ("preparing the sandbox view", "done"),
            ("checking the VM", "started"),
            ("checking the VM", "done"),
            ("checking provisioning", "started"),
            ("checking provisioning", "done"),
            ("launching", "started"),
            ("launching", "done"),
        ]),
        "{events:#?}"
    );
    let calls = l.calls();
    assert!(
        !calls.contains(" create ") && !calls.contains(" start "),
        "{calls}"
    );
    // The first connection saw the second box's steps too (best-effort broadcast).
    let seen = client.next_event().unwrap();
    assert_eq!(seen.name.as_deref(), Some("vm2"), "{seen:?}");
}

#[test]
fn box_create_announces_the_step_that_failed() {
    let l = Lima::new();
    l.standin.mode("create", "download-fails");
    let daemon = Daemon::start_with(&l.env, l.cmd());
    let (events, reply) = create_lima_box(&l, &mut daemon.client(), "vm");
    let error = reply.error.unwrap_or_else(|| panic!("{:?}", reply.result));
    assert_eq!(error.code, sandbox_protocol::ErrorCode::BackendUnavailable);
    let steps = steps(&events);
    // The steps up to the image download, which fails: announced as failed, with why.
    assert_eq!(
        steps,
        pairs(&[
            ("preparing the sandbox view", "started"),
            ("preparing the sandbox view", "done"),
            ("checking the VM", "started"),
            ("checking the VM", "done"),
            ("creating the VM", "started"),
            ("creating the VM", "done"),
            ("downloading the image", "started"),
            ("downloading the image", "failed"),
        ]),
        "{events:#?}"
    );
    let why = events.last().unwrap().step_error.clone().unwrap();
    assert!(why.contains("could not be downloaded"), "{why}");
    assert!(
        error.message.contains("could not be downloaded"),
        "{error:?}"
    );
    assert!(events.iter().all(|e| e.state == Some(BoxState::Creating)));
}

/// `sandbox lima config` on a machine without Lima: the YAML that would run, not a refusal
/// (a user sees what the VM would be before installing anything).
#[test]
fn config_prints_the_yaml_without_limactl() {
    let l = Lima::new();
    // A PATH with git and a shell and nothing else: no limactl anywhere.
    let bin = l.env.path().join("bin-without-lima");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["git", "sh"] {
        let found = ["/usr/bin", "/bin", "/usr/local/bin"]
            .iter()
            .map(|d| PathBuf::from(d).join(tool))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("no {tool} on this machine"));
        std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
    }
    let mut cmd = l.env.cmd();
    cmd.env_remove("SANDBOX_LIMACTL")
        .env("PATH", &bin)
        .env("SANDBOX_LIMA_HOME", l.env.path().join("lh"))
        .current_dir(&l.task);
    let out = cmd.args(["lima", "config"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(yaml.contains("mountType:"), "{yaml}");
    assert!(yaml.contains("mounts:"), "{yaml}");
    // Without limactl, the commands that need it still say so.
    let mut cmd = l.env.cmd();
    cmd.env_remove("SANDBOX_LIMACTL")
        .env("PATH", &bin)
        .env("SANDBOX_LIMA_HOME", l.env.path().join("lh"))
        .current_dir(&l.task);
    let out = cmd.args(["lima", "status"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("limactl"), "{}", text(&out));
}
