//! The checks of `cargo xtask lima-test`, in order, on one VM: a linked worktree's first
//! `sandbox run --backend lima` boots it, the last check deletes it. A check whose failure
//! leaves the rest meaningless (no VM, no commit) ends the run there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_json::Value;

use super::{Outcome, Setup};

/// The command the runs commit with (no identity is configured in the guest).
const COMMIT: &str = "git -c user.name=vm -c user.email=vm@example.com commit -q";

struct Runner<'a> {
    setup: &'a Setup,
    outcomes: Vec<Outcome>,
}

fn text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

impl Runner<'_> {
    fn check(&mut self, name: &'static str, f: impl FnOnce(&Setup) -> Result<String>) -> bool {
        eprintln!("lima-test: {name}");
        let started = Instant::now();
        let result = f(self.setup);
        let ok = result.is_ok();
        if let Err(e) = &result {
            eprintln!("lima-test: FAILED: {e:#}");
        }
        self.outcomes.push(Outcome {
            name,
            result,
            took: started.elapsed(),
        });
        ok
    }
}

impl Setup {
    fn task(&self) -> PathBuf {
        self.work().join("app-task")
    }

    /// A script as the user that must succeed; its stdout.
    fn ok(&self, dir: &Path, script: &str) -> Result<String> {
        let out = self.sh(dir, script, b"")?;
        ensure!(out.status.success(), "`{script}` failed: {}", text(&out));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    fn rev(&self, rev: &str) -> Result<String> {
        self.ok(&self.work().join("app"), &format!("git rev-parse {rev}"))
    }

    /// `sandbox lima status --json` of the project.
    fn status(&self) -> Result<Value> {
        let out = self.ok(&self.task(), "sandbox lima status --json")?;
        serde_json::from_str(&out).with_context(|| format!("status --json: {out}"))
    }

    fn state(&self) -> Result<String> {
        Ok(self.status()?["state"]["state"]
            .as_str()
            .unwrap_or("?")
            .to_owned())
    }

    /// A command in the VM outside any view, as the Lima user (`limactl shell`).
    fn guest(&self, script: &str) -> Result<std::process::Output> {
        let instance = self.status()?["instance"]
            .as_str()
            .context("no instance in status --json")?
            .to_owned();
        let quoted = sandbox_lima::provision::sh_quote(script);
        self.sh(
            &self.task(),
            &format!("limactl shell --workdir / {instance} -- sh -c {quoted}"),
            b"",
        )
    }
}

/// Waits (bounded) for `cond`, re-asking on every change it could see; `what` for the error.
fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let started = Instant::now();
    while !cond()? {
        if started.elapsed() > limit {
            bail!("{what}: not within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn is_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Every check, in order; the VM is deleted at the end unless `keep`.
pub fn all(setup: &Setup, keep: bool) -> Vec<Outcome> {
    let mut r = Runner {
        setup,
        outcomes: Vec::new(),
    };
    let mut sha = String::new();
    let ok = r.check("a repository with a linked task worktree, a home with secrets", |s| {
        s.ok(
            &s.work(),
            "git init -q -b main app && cd app && git -c user.name=host -c user.email=h@example.com \
             commit -q --allow-empty -m init && git worktree add -q ../app-task -b task && \
             mkdir -p \"$HOME/.ssh\" && echo key >\"$HOME/.ssh/id_ed25519\" && \
             echo secret >\"$HOME/secret-marker\"",
        )?;
        Ok(String::new())
    }) && r.check(
        "sandbox run --backend lima: creates and boots the VM, commits in the view",
        |s| {
            let out = s.ok(
                &s.task(),
                &format!(
                    "sandbox run --backend lima -- sh -c 'echo vm >vm.txt && git add vm.txt && \
                     {COMMIT} -m \"from the VM\" && git rev-parse HEAD'"
                ),
            )?;
            sha = out.lines().last().unwrap_or("").to_owned();
            ensure!(is_sha(&sha), "no commit printed: {out}");
            Ok(format!("first boot and the command; commit {}", &sha[..12]))
        },
    ) && r.check("the commit is on s/task, and task is fast-forwarded to it", |s| {
        ensure!(s.rev("s/task")? == sha, "s/task is not the VM's commit");
        wait_for("task fast-forwarded", Duration::from_secs(60), || {
            Ok(s.rev("task")? == sha)
        })?;
        Ok(String::new())
    });
    if ok {
        r.check("a warm run (the VM running)", |s| {
            let out = s.ok(
                &s.task(),
                "sandbox run --backend lima -- git log -1 --format=%H",
            )?;
            ensure!(
                out.ends_with(&sha),
                "the view's HEAD is not the commit: {out}"
            );
            Ok(String::new())
        });
        r.check(
            "the VM mounts exactly the plan's shares, nothing of the home",
            mounts,
        );
        r.check(
            "root in the VM cannot write the repository's hooks or config",
            hooks,
        );
        r.check(
            "sandbox exec --backend lima passes stdin, stdout and argv exactly",
            exec,
        );
        r.check(
            "a host commit in parallel is reported as diverged",
            diverged,
        );
        r.check(
            "sandbox lima status, stop, start (its steps), run again",
            lifecycle,
        );
        r.check("sandbox lima config: the YAML names the image and its digest; limactl validate takes it", config);
        r.check("sandbox lima recreate boots a new VM (its steps)", |s| {
            let out = s.ok(&s.task(), "sandbox lima recreate --yes --json")?;
            let steps = started_steps(&out);
            expect_steps(
                &steps,
                &[
                    "deleting the VM",
                    "creating the VM",
                    "downloading the image",
                    "starting the VM",
                    "connecting over SSH",
                    "provisioning",
                    "checking provisioning",
                ],
            )?;
            ensure!(s.state()? == "running", "not running after recreate");
            let out = s.ok(
                &s.task(),
                "sandbox run --backend lima -- git rev-parse HEAD",
            )?;
            ensure!(
                out.ends_with(&s.rev("s/task")?),
                "the view after recreate: {out}"
            );
            Ok(String::new())
        });
    }
    if !keep {
        r.check("sandbox lima delete removes the VM", |s| {
            s.ok(&s.task(), "sandbox lima delete --yes")?;
            ensure!(s.state()? == "absent", "the VM is still there");
            Ok(String::new())
        });
    }
    r.outcomes
}

/// The guest's virtiofs mounts are the status's mounts, with their modes; the home's files
/// are not there.
fn mounts(s: &Setup) -> Result<String> {
    let status = s.status()?;
    let want: BTreeSet<(String, &str)> = status["mounts"]
        .as_array()
        .context("no mounts in status --json")?
        .iter()
        .map(|m| {
            let rw = if m["writable"] == true { "rw" } else { "ro" };
            (m["mountPoint"].as_str().unwrap_or("").to_owned(), rw)
        })
        .collect();
    let out = s.guest("cat /proc/mounts")?;
    ensure!(out.status.success(), "cat /proc/mounts: {}", text(&out));
    let have: BTreeSet<(String, &str)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(2) == Some(&"virtiofs")).then(|| {
                let rw = if f[3].split(',').any(|o| o == "rw") {
                    "rw"
                } else {
                    "ro"
                };
                (f[1].to_owned(), rw)
            })
        })
        .collect();
    ensure!(have == want, "the guest mounts {have:?}, the plan {want:?}");
    let home = s.home().display().to_string();
    let out = s.guest(&format!(
        "test ! -e '{home}/secret-marker' && test ! -e '{home}/.ssh'"
    ))?;
    ensure!(
        out.status.success(),
        "the home's files are in the VM: {}",
        text(&out)
    );
    Ok(format!("{} shares", want.len()))
}

/// From the attacker's side: root in the VM remounts the common dir `rw` and writes a hook
/// and the config; inside the view, root writes a hook into the overlay. The host's stay.
fn hooks(s: &Setup) -> Result<String> {
    let common = s.work().join("app/.git");
    let config = std::fs::read(common.join("config"))?;
    let c = common.display();
    // The guest's kernel lets root remount the share `rw` (the mount option is the guest's);
    // what must refuse the writes is virtiofsd's `--readonly`, on the host.
    let out = s.guest(&format!(
        "sudo mount -o remount,rw '{c}' && grep -q \" {c} virtiofs rw\" /proc/mounts && \
         echo remounted; sudo sh -c 'echo planted >\"{c}/hooks/planted-by-vm\"; \
         echo \"[planted]\" >>\"{c}/config\"'"
    ))?;
    ensure!(
        String::from_utf8_lossy(&out.stdout).contains("remounted"),
        "root in the VM could not even remount the common dir rw: {}",
        text(&out)
    );
    ensure!(
        !out.status.success(),
        "the writes succeeded in the VM: {}",
        text(&out)
    );
    s.ok(
        &s.task(),
        "sandbox run --backend lima -- sh -c 'sudo sh -c \"echo planted >$(git rev-parse \
         --git-common-dir)/hooks/planted-in-view\"'",
    )?;
    for name in ["planted-by-vm", "planted-in-view"] {
        ensure!(
            !common.join("hooks").join(name).exists(),
            "hooks/{name} landed on the host"
        );
    }
    ensure!(
        std::fs::read(common.join("config"))? == config,
        "the config changed"
    );
    let refused = String::from_utf8_lossy(&out.stderr);
    Ok(refused.lines().last().unwrap_or("").to_owned())
}

/// 64 KiB of every byte value through `cat`, and words a shell would split or expand.
fn exec(s: &Setup) -> Result<String> {
    let input: Vec<u8> = (0..=255u8).cycle().take(65536 + 7).collect();
    let out = s.sh(&s.task(), "sandbox exec --backend lima -- cat", &input)?;
    ensure!(out.status.success(), "sandbox exec cat: {}", text(&out));
    ensure!(
        out.stdout == input,
        "cat gave {} bytes back, not the {} sent (or other ones)",
        out.stdout.len(),
        input.len()
    );
    let out = s.sh(
        &s.task(),
        r#"sandbox exec --backend lima -- printf '%s|' 'a  b' "it's" '$HOME' '*' '' 'x"y'"#,
        b"",
    )?;
    ensure!(out.status.success(), "sandbox exec printf: {}", text(&out));
    let want = r#"a  b|it's|$HOME|*||x"y|"#;
    let got = String::from_utf8_lossy(&out.stdout);
    ensure!(got == want, "argv came through as {got:?}, not {want:?}");
    Ok(format!("{} bytes", input.len()))
}

/// The VM's command starts and waits; the host commits on the task branch meanwhile; then the
/// VM commits on the view's old base. Neither branch is moved, and the view's status says
/// diverged. (A host commit made after the VM's is no divergence: the watcher has already
/// fast-forwarded the task branch to the VM's commit, and the host's lands on top.)
fn diverged(s: &Setup) -> Result<String> {
    let view = s.status()?["views"][0]
        .as_str()
        .map(PathBuf::from)
        .context("no view in status --json")?;
    let script = format!(
        "sandbox run --backend lima -- sh -c 'touch .vm-started && \
         while [ ! -e .host-done ]; do sleep 0.1; done && echo vm2 >vm2.txt && \
         git add vm2.txt && {COMMIT} -m vm2 && git rev-parse HEAD >.vm-done'"
    );
    let mut cmd = s.user.command("bash");
    cmd.args(["-c", &script])
        .current_dir(s.task())
        .env_clear()
        .envs(s.env())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn()?;
    let started = view.join(".vm-started");
    let waited = wait_for("the VM's command", Duration::from_secs(120), || {
        Ok(started.exists())
    });
    let host = waited.and_then(|()| {
        s.ok(
            &s.task(),
            "echo host >host.txt && git add host.txt && git -c user.name=host \
             -c user.email=h@example.com commit -q -m host && git rev-parse HEAD",
        )
    });
    std::fs::write(view.join(".host-done"), "")?;
    let out = child.wait_with_output()?;
    let host = host?;
    ensure!(out.status.success(), "the VM's run: {}", text(&out));
    let vm = std::fs::read_to_string(view.join(".vm-done"))?
        .trim()
        .to_owned();
    ensure!(s.rev("s/task")? == vm, "s/task is not the VM's commit");
    ensure!(s.rev("task")? == host, "task moved off the host's commit");
    let status = s.ok(&s.task(), "sandbox view status app-task --json")?;
    let state: Value = serde_json::from_str(&status).context("view status --json")?;
    ensure!(
        state["sync"]["state"] == "diverged",
        "the view's status: {}",
        state["sync"]
    );
    // Back to one line of history for the checks after this one.
    s.ok(
        &s.task(),
        "git -c user.name=host -c user.email=h@example.com merge -q --no-edit s/task",
    )?;
    Ok(String::new())
}

/// The steps `--json` reported as started, in order (the result after them is pretty-printed
/// over several lines, which do not parse one by one).
fn started_steps(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "step" && v["step"]["state"] == "started")
        .filter_map(|v| v["step"]["step"].as_str().map(str::to_owned))
        .collect()
}

/// `want` appear in `steps`, in this order (Lima's log names each as it comes).
fn expect_steps(steps: &[String], want: &[&str]) -> Result<()> {
    let mut rest = steps.iter();
    for w in want {
        ensure!(rest.any(|s| s == w), "no step {w:?} in order in {steps:?}");
    }
    Ok(())
}

fn lifecycle(s: &Setup) -> Result<String> {
    ensure!(s.state()? == "running", "not running");
    s.ok(&s.task(), "sandbox lima stop")?;
    ensure!(s.state()? == "stopped", "not stopped after stop");
    let started = Instant::now();
    let out = s.ok(&s.task(), "sandbox lima start --json")?;
    let took = started.elapsed();
    let steps = started_steps(&out);
    expect_steps(
        &steps,
        &[
            "starting the VM",
            "connecting over SSH",
            "provisioning",
            "checking provisioning",
        ],
    )?;
    ensure!(s.state()? == "running", "not running after start");
    s.ok(&s.task(), "sandbox run --backend lima -- true")?;
    Ok(format!(
        "restart {:.0} s; steps {}",
        took.as_secs_f64(),
        steps.join(", ")
    ))
}

fn config(s: &Setup) -> Result<String> {
    let yaml = s.ok(&s.task(), "sandbox lima config")?;
    let file = s.run.join("config.yaml");
    std::fs::write(&file, format!("{yaml}\n"))?;
    s.user.own(&file)?;
    s.ok(&s.task(), &format!("limactl validate '{}'", file.display()))?;
    let image = s.image.display().to_string();
    ensure!(yaml.contains(&image), "the YAML does not name {image}");
    let digest = std::fs::read_to_string(
        s.image
            .parent()
            .ok_or_else(|| anyhow!("the image has no directory"))?
            .join("digest"),
    )?;
    ensure!(
        yaml.contains(digest.trim()),
        "the YAML lacks the digest {}",
        digest.trim()
    );
    Ok(String::new())
}
