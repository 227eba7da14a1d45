//! A real daemon (`sandbox serve`, under its supervisor) in a test's private environment, and
//! a way to run one command in a box of it the way `sandbox run` runs one: the escape suite
//! and the service tests drive the same backends through both paths.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};

use sandbox_protocol::Incoming;
use sandbox_service::{Client, ClientError, RuntimePaths};
use serde_json::{json, Value};

use super::Env;

pub use sandbox_testkit::req;

/// `sandbox serve` for one test; stopped (SIGTERM to the supervisor) when dropped.
pub struct Daemon {
    pub runtime: PathBuf,
    pub supervisor: Child,
    pub log: Arc<Mutex<String>>,
    /// The daemon process (the supervisor's child).
    pub pid: i32,
    /// The thread that reads the log to its end (the daemon's stderr closed).
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// Starts the daemon of `env` and waits until it says it listens (it prints that line
    /// after both listeners are bound).
    pub fn start(env: &Env) -> Daemon {
        Daemon::start_with(env, env.cmd())
    }

    /// The same, with `cmd` (`sandbox` under a wrapper: `env.cmd_under(…)`).
    pub fn start_with(env: &Env, mut cmd: std::process::Command) -> Daemon {
        let mut supervisor = cmd
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(supervisor.stderr.take().unwrap());
        let log = Arc::new(Mutex::new(String::new()));
        loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap() == 0 {
                panic!(
                    "the daemon exited before listening: {}",
                    log.lock().unwrap()
                );
            }
            log.lock().unwrap().push_str(&line);
            if line.contains("listening on") {
                break;
            }
        }
        let sink = log.clone();
        let reader = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
            sink.lock().unwrap().push_str(&rest);
        });
        let mut d = Daemon {
            runtime: env.path().join("run/sandbox"),
            supervisor,
            log,
            pid: 0,
            reader: Some(reader),
        };
        let describe = d.client().call(&req("host.describe", json!({}))).unwrap();
        d.pid = describe["pid"].as_i64().unwrap() as i32;
        d
    }

    /// The whole log, once the daemon and its supervisor are gone: waits for the reader to
    /// reach the end of their stderr (a line written just before the exit is read after it).
    pub fn log_to_the_end(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.log.lock().unwrap().clone()
    }

    pub fn paths(&self) -> RuntimePaths {
        RuntimePaths::new(&self.runtime)
    }

    pub fn client(&self) -> Client {
        Client::connect_authenticated(&self.paths(), "test").unwrap()
    }

    /// Creates and starts box `name` (`params` are `box.create`'s, besides name and workdir).
    pub fn create(
        &self,
        client: &mut Client,
        name: &str,
        workdir: &Path,
        params: Value,
    ) -> Result<Value, ClientError> {
        let mut all = json!({"name": name, "workdir": workdir});
        for (k, v) in params.as_object().unwrap() {
            all[k] = v.clone();
        }
        let created = client.call(&req("box.create", all))?;
        client.call(&req("box.start", json!({"name": name})))?;
        Ok(created)
    }

    /// Runs `argv` in a fresh box over `workdir` and returns what a `sandbox run` of it would
    /// have shown: its stdout, its stderr followed by the daemon's notes for it (a backend
    /// failure, pointer repairs), and its exit status. A box that cannot be created ends
    /// with 125 and the daemon's error on stderr, as `sandbox run` would.
    pub fn run_once(&self, workdir: &Path, params: Value, argv: &[&str]) -> Output {
        let mut client = self.client();
        let name = format!("once-{}", super::escape::unique());
        if let Err(e) = self.create(&mut client, &name, workdir, params) {
            return Output {
                status: ExitStatus::from_raw(125 << 8),
                stdout: Vec::new(),
                stderr: format!("sandbox: {e}\n").into_bytes(),
            };
        }
        let reply = client.call(&req(
            "box.exec",
            json!({"name": name, "command": argv[0], "args": &argv[1..]}),
        ));
        let out = match reply {
            Ok(reply) => collect(&mut client, reply["execId"].as_u64().unwrap()),
            Err(e) => {
                let code = match &e {
                    ClientError::Rpc(rpc) => rpc
                        .data
                        .as_ref()
                        .and_then(|d| d["exitCode"].as_i64())
                        .unwrap_or(125) as i32,
                    _ => 125,
                };
                Output {
                    status: ExitStatus::from_raw(code << 8),
                    stdout: Vec::new(),
                    stderr: format!("sandbox: {e}\n").into_bytes(),
                }
            }
        };
        let _ = client.call(&req("box.remove", json!({"name": name, "force": true})));
        out
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.supervisor.try_wait() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.supervisor.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.supervisor.wait();
        }
    }
}

/// Reads events until `exec_id`'s exit: its output, its exit as a status, and the exit
/// event's message appended to stderr.
pub fn collect(client: &mut Client, exec_id: u64) -> Output {
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    loop {
        let event: Incoming = client.next_event().unwrap();
        if event.exec_id != Some(exec_id) {
            continue;
        }
        match event.kind.as_deref() {
            Some("output") => {
                let bytes = event.output_bytes().unwrap();
                match event.stream.as_deref() {
                    Some("stdout") => stdout.extend(bytes),
                    Some("stderr") => stderr.extend(bytes),
                    other => panic!("stream {other:?}"),
                }
            }
            Some("exit") => {
                if let Some(message) = &event.error_message {
                    stderr.extend(format!("sandbox: {message}\n").into_bytes());
                }
                let status = match event.signal {
                    Some(sig) => ExitStatus::from_raw(sig),
                    None => ExitStatus::from_raw(event.exit_code.unwrap() << 8),
                };
                return Output {
                    status,
                    stdout,
                    stderr,
                };
            }
            other => panic!("event {other:?}"),
        }
    }
}
