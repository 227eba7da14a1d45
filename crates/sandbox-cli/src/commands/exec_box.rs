//! `sandbox exec --backend boxlite`: the stdio proxy through the daemon's BoxLite boxes.
//!
//! The daemon owns the one BoxLite runtime, so this command is a client of it: it connects
//! (starting the daemon if none runs), creates the named box or reuses it (`box.create` with
//! the same name and settings), starts it, runs `--probe` / `--provision` as in the in-place
//! backends, then runs the command with `box.exec` and relays: our stdin to `exec.stdin` (on
//! a second connection, so reading and writing never wait on each other), `output` events to
//! our stdout and stderr, the `exit` event's code as ours. Every line of our own, each step of
//! the box and the probe's and provisioning's output go to stderr.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use base64::Engine as _;
use sandbox_protocol::{decode_frame, Decoded, Frame, Incoming, Request};
use sandbox_service::{Client, ClientError, RuntimePaths};
use serde_json::{json, Value};

use sandbox_host::ExitStatus;

use super::exec::{ensure_ready, Readiness, StepEnd};
use crate::cli::args::ExecArgs;
use crate::context::Context;
use crate::exit::Failure;

fn req(method: &str, params: Value) -> anyhow::Result<Request> {
    let line = serde_json::to_vec(&json!({"id": 0, "method": method, "params": params}))?;
    match decode_frame(&Frame::Line(line)) {
        Decoded::Request(_, r) => Ok(r),
        other => anyhow::bail!("{method}: {other:?}"),
    }
}

/// `--mount HOST:GUEST` for a VM: GUEST is an absolute path in the box (the last `:` that
/// starts one splits, so HOST may hold a `:`).
pub fn vm_mount(spec: &str) -> Result<(PathBuf, PathBuf), super::exec::BoxError> {
    let split = spec
        .match_indices(":/")
        .last()
        .map(|(i, _)| (&spec[..i], &spec[i + 1..]));
    match split {
        Some((host, guest)) if !host.is_empty() => Ok((PathBuf::from(host), PathBuf::from(guest))),
        _ => Err(super::exec::BoxError::MountSyntax(spec.to_string())),
    }
}

/// The default box name: `exec-` and the task directory's name, made safe.
fn default_name(root: &Path) -> String {
    let base: String = root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(50)
        .collect();
    format!("exec-{}", base.trim_start_matches(['.', '-']))
}

fn rpc_failure(what: &str, e: ClientError) -> anyhow::Error {
    Failure::setup(format!("exec: {what}: {e}"))
}

pub fn run(args: ExecArgs, ctx: &Context) -> anyhow::Result<i32> {
    if let Some(remote) = args.sandbox.allow_push.first() {
        return Err(Failure::setup(format!(
            "--allow-push {remote}: a push from a box has no quarantine yet (its commits come \
             back to the task branch); push from `sandbox run --backend native`, or on the host"
        )));
    }
    let root =
        crate::session::task_root(&crate::session::workdir(args.sandbox.workdir.as_deref())?);
    let name = args.box_name.clone().unwrap_or_else(|| default_name(&root));
    let mut mounts = Vec::new();
    for spec in &args.mount {
        let (host, guest) = vm_mount(spec).map_err(Failure::setup_caused)?;
        let host = std::fs::canonicalize(&host)
            .map_err(|e| Failure::setup(format!("--mount {spec}: {}: {e}", host.display())))?;
        mounts.push(json!({"host": host, "guest": guest}));
    }
    let mut allow_net = args.allow_net.clone();
    allow_net.extend(args.sandbox.allow_domain.iter().cloned());
    let mut env = serde_json::Map::new();
    for e in &args.sandbox.env {
        match e.split_once('=') {
            Some((k, v)) => env.insert(k.to_string(), json!(v)),
            None => env.insert(e.clone(), json!(std::env::var(e).unwrap_or_default())),
        };
    }
    let mut params = json!({
        "name": name, "backend": "boxlite", "workdir": root,
        "mounts": mounts, "allowNet": allow_net, "env": env,
        "blockNet": args.sandbox.block_net,
        "unprotectedGit": args.sandbox.unprotected_git,
        "allowNestedGit": args.sandbox.allow_nested_git,
    });
    // Refused by boxlite (no proxy of the host's in the VM yet), loudly rather than dropped.
    if !args.sandbox.credential.is_empty() {
        params["credentials"] = json!(args.sandbox.credential);
    }
    // --cpus and --memory size the box (whole CPUs, MiB, rounded up), from the same fields
    // as a run's limits; without them the daemon takes the configuration's `limits:`.
    let [memory, _, cpus] = args.sandbox.resources();
    let (cpus, memory_mib) =
        sandbox_policy::compile::limits::vm_size(cpus.flatten(), memory.flatten());
    if let Some(cpus) = cpus {
        params["cpus"] = json!(cpus);
    }
    if let Some(mib) = memory_mib {
        params["memoryMib"] = json!(mib);
    }
    if let Some(image) = &args.image {
        params["image"] = json!(image);
    }
    if let Some(rootfs) = &args.rootfs {
        let abs = std::path::absolute(rootfs).unwrap_or_else(|_| rootfs.clone());
        params["rootfs"] = json!(abs);
    }

    let paths = RuntimePaths::new(&ctx.dirs.runtime);
    super::serve::connect_or_start(&paths).map_err(|e| Failure::setup(format!("exec: {e:#}")))?;
    let mut client = Client::connect_authenticated(&paths, "sandbox-exec")
        .map_err(|e| rpc_failure("connecting to the daemon", e))?;
    let created =
        call(&mut client, "box.create", params).map_err(|e| rpc_failure("box.create", e))?;
    if created["created"] == json!(false) {
        eprintln!("sandbox: exec: reusing box {name}");
    }
    call(&mut client, "box.start", json!({"name": name}))
        .map_err(|e| rpc_failure("box.start", e))?;

    let cwd = match &args.sandbox.cd {
        Some(cd) => root.join(cd),
        None => root.clone(),
    };
    let timeout_ms = args.sandbox.timeout.map(|t| t.as_millis() as u64);
    let ready = ensure_ready(
        args.probe.as_deref(),
        args.provision.as_deref(),
        |_, script| {
            let status = run_in_box(
                &mut client,
                &paths,
                &name,
                "/bin/sh",
                &["-c".to_string(), script.to_string()],
                &cwd,
                timeout_ms,
                Relay::StepToStderr,
            )?;
            Ok(StepEnd::Exited(status))
        },
    );
    match ready {
        Ok(Readiness::Interrupted(sig)) => return Ok(super::exec::interrupted(sig)),
        Ok(_) => {}
        Err(e) => return Err(Failure::setup_chain(e)),
    }
    let mut argv = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned());
    let program = argv.next().context("no command")?;
    let rest: Vec<String> = argv.collect();
    let status = run_in_box(
        &mut client,
        &paths,
        &name,
        &program,
        &rest,
        &cwd,
        timeout_ms,
        Relay::Stdio,
    )?;
    Ok(status.code)
}

fn call(client: &mut Client, method: &str, params: Value) -> Result<Value, ClientError> {
    let request = req(method, params).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let id = client.send(&request)?;
    // The steps of box.create and box.start, on stderr as they come.
    loop {
        let frame = client.next_frame()?;
        if frame.is_reply() {
            return client_reply(frame, &id);
        }
        note_box_state(&frame);
    }
}

fn client_reply(frame: Incoming, _id: &sandbox_protocol::Id) -> Result<Value, ClientError> {
    match (frame.result, frame.error) {
        (_, Some(e)) => Err(ClientError::Rpc(e)),
        (Some(v), None) => Ok(v),
        (None, None) => Ok(Value::Null),
    }
}

fn note_box_state(frame: &Incoming) {
    if frame.kind.as_deref() != Some("boxState") {
        return;
    }
    let (Some(step), Some(state)) = (&frame.step, &frame.step_state) else {
        return;
    };
    let name = frame.name.as_deref().unwrap_or("?");
    match (state.as_str(), frame.step_ms) {
        ("done", Some(ms)) => eprintln!("sandbox: exec: box {name}: {step}: {ms} ms"),
        ("failed", _) => eprintln!(
            "sandbox: exec: box {name}: {step}: failed: {}",
            frame.step_error.as_deref().unwrap_or("")
        ),
        _ => {}
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Relay {
    /// Probe and provisioning: no stdin, both streams to our stderr.
    StepToStderr,
    /// The command: our stdin in, its stdout to ours, byte for byte.
    Stdio,
}

#[allow(clippy::too_many_arguments)]
fn run_in_box(
    client: &mut Client,
    paths: &RuntimePaths,
    name: &str,
    program: &str,
    args: &[String],
    cwd: &Path,
    timeout_ms: Option<u64>,
    relay: Relay,
) -> anyhow::Result<ExitStatus> {
    let stdin = relay == Relay::Stdio;
    let mut params = json!({
        "name": name, "command": program, "args": args, "workingDir": cwd, "stdin": stdin,
    });
    if let Some(t) = timeout_ms {
        params["timeoutMs"] = json!(t);
    }
    let started = call(client, "box.exec", params).map_err(|e| rpc_failure("box.exec", e))?;
    let exec_id = started["execId"].as_u64().context("box.exec: no execId")?;
    if stdin {
        // A second connection carries stdin, so a command that does not read cannot hold up
        // its own output here.
        let mut writer = Client::connect_authenticated(paths, "sandbox-exec-stdin")
            .map_err(|e| rpc_failure("connecting for stdin", e))?;
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut input = std::io::stdin().lock();
            loop {
                let n = input.read(&mut buf).unwrap_or(0);
                let data = base64::engine::general_purpose::STANDARD.encode(&buf[..n]);
                let params =
                    json!({"execId": exec_id, "data": data, "encoding": "base64", "close": n == 0});
                let Ok(request) = req("exec.stdin", params) else {
                    return;
                };
                if writer.call(&request).is_err() || n == 0 {
                    return;
                }
            }
        });
    }
    let mut out = std::io::stdout().lock();
    loop {
        let frame = client
            .next_event()
            .map_err(|e| rpc_failure("waiting for the command", e))?;
        if frame.exec_id != Some(exec_id) {
            note_box_state(&frame);
            continue;
        }
        match frame.kind.as_deref() {
            Some("output") => {
                let bytes = frame
                    .output_bytes()
                    .map_err(|e| Failure::setup(format!("exec: {e}")))?;
                if relay == Relay::Stdio && frame.stream.as_deref() == Some("stdout") {
                    out.write_all(&bytes)?;
                    out.flush()?;
                } else {
                    let mut err = std::io::stderr().lock();
                    let _ = err.write_all(&bytes).and_then(|()| err.flush());
                }
            }
            Some("exit") => {
                if let Some(m) = &frame.error_message {
                    eprintln!("sandbox: exec: {program}: {m}");
                }
                // The daemon built it by the one exit rule: its fields as they are.
                return Ok(ExitStatus {
                    code: frame.exit_code.unwrap_or(125),
                    signal: frame.signal,
                    timed_out: frame.timed_out.unwrap_or(false),
                });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_mounts_split_at_the_guest_path() {
        assert_eq!(
            vm_mount("/work/project:/workspace").unwrap(),
            (PathBuf::from("/work/project"), PathBuf::from("/workspace"))
        );
        assert_eq!(
            vm_mount("/w/a:b:/in").unwrap(),
            (PathBuf::from("/w/a:b"), PathBuf::from("/in"))
        );
        for bad in ["/w/p", ":/w", "/w/p:rel"] {
            assert!(vm_mount(bad).is_err(), "{bad}");
        }
        assert_eq!(default_name(Path::new("/w/.my task")), "exec-my-task");
    }
}
