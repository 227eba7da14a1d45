//! Why a git command inside failed, in git's own words: its trace2 event stream.
//!
//! Inside the quarantine the repository's refs other than the task's are pinned read-only, so
//! `git branch -D` or `git update-ref` of a ref the task does not own fails with git's
//! `Device or resource busy` — which says nothing of the sandbox. A failed write to a pin leaves nothing in the layer to report from, and an
//! exit status says nothing of its cause. git itself does: every git process sends its
//! trace2 events (`start` with its argv, `error` with the message it prints) to the target
//! named in `GIT_TRACE2_EVENT`, here `af_unix:stream:<socket>` — a socket the host binds in
//! the run's private TMPDIR and reads on a thread of its own ([`GitTrace`]). Region events
//! are cut at the first level (`GIT_TRACE2_EVENT_NESTING=1`): they are most of the stream
//! and say nothing of failures.
//!
//! What comes in is written by processes inside, so it decides nothing: it only selects which
//! line to print, and a line is printed only when git's message names a file the host
//! itself pinned ([`explain`], pure). A process that forges events can at most make the host
//! print such a line for a command it could have run for real.

// Elsewhere there is no listener (the quarantine is Linux's): the collecting goes unused.
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

use std::collections::BTreeSet;
use std::ffi::OsString;
#[cfg(target_os = "linux")]
use std::os::fd::AsFd;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// What one tree of git processes (a command and the git commands it ran) sent: the argv of
/// its first process and the messages of its `error` events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failure {
    pub argv: Vec<String>,
    pub errors: Vec<String>,
    /// The repository paths its `git-receive-pack` processes were started on (a push to a
    /// local path runs one, inside).
    pub pushed_to: Vec<String>,
}

/// At most this many command trees, messages per tree and bytes per message are kept: the
/// events come from inside, and a flood of them costs the host no more than this.
const MAX_TREES: usize = 64;
const MAX_ERRORS: usize = 8;
const MAX_MESSAGE: usize = 2048;

/// What the events say so far, one entry per tree that reported an error (in order), and
/// the argv of trees not yet seen failing.
#[derive(Debug, Default)]
struct Collected {
    trees: Vec<(String, Failure)>,
}

impl Collected {
    fn tree(&mut self, root: &str) -> Option<&mut Failure> {
        if let Some(i) = self.trees.iter().position(|(sid, _)| sid == root) {
            return Some(&mut self.trees[i].1);
        }
        if self.trees.len() >= MAX_TREES {
            // Forget the oldest tree that never failed, if any.
            let quiet = self.trees.iter().position(|(_, f)| f.errors.is_empty())?;
            self.trees.remove(quiet);
        }
        self.trees.push((root.to_string(), Failure::default()));
        self.trees.last_mut().map(|(_, f)| f)
    }

    /// Takes in one event (a JSON object); anything else is ignored.
    fn event(&mut self, bytes: &[u8]) {
        let Ok(event) = serde_json::from_slice::<serde_json::Value>(bytes) else {
            return;
        };
        let (Some(kind), Some(sid)) = (
            event.get("event").and_then(|v| v.as_str()),
            event.get("sid").and_then(|v| v.as_str()),
        ) else {
            return;
        };
        // A child's sid is its parent's, a slash, and its own.
        let root = sid.split('/').next().unwrap_or(sid);
        let is_root = root == sid;
        match kind {
            "start" if is_root => {
                let argv: Vec<String> = event
                    .get("argv")
                    .and_then(|v| v.as_array())
                    .map(|a| {
                        a.iter()
                            .take(32)
                            .filter_map(|s| s.as_str())
                            .map(|s| s.chars().take(256).collect())
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(tree) = self.tree(root) {
                    tree.argv = argv;
                }
            }
            "start" => {
                let argv: Vec<&str> = event
                    .get("argv")
                    .and_then(|v| v.as_array())
                    .map(|a| a.iter().take(4).filter_map(|s| s.as_str()).collect())
                    .unwrap_or_default();
                let path = match argv.as_slice() {
                    [pack, path, ..] if pack.ends_with("git-receive-pack") => Some(*path),
                    [git, "receive-pack", path, ..] if git.ends_with("git") => Some(*path),
                    _ => None,
                };
                if let (Some(path), Some(tree)) = (path, self.tree(root)) {
                    if tree.pushed_to.len() < MAX_ERRORS {
                        tree.pushed_to
                            .push(path.chars().take(MAX_MESSAGE).collect());
                    }
                }
            }
            "error" => {
                let Some(msg) = event.get("msg").and_then(|v| v.as_str()) else {
                    return;
                };
                if let Some(tree) = self.tree(root) {
                    if tree.errors.len() < MAX_ERRORS {
                        tree.errors.push(msg.chars().take(MAX_MESSAGE).collect());
                    }
                }
            }
            _ => {}
        }
    }

    fn failures(self) -> Vec<Failure> {
        self.trees
            .into_iter()
            .map(|(_, f)| f)
            .filter(|f| !f.errors.is_empty())
            .collect()
    }
}

/// The trace listener of one command: a datagram socket in a directory the command can
/// reach, and the thread that reads it. [`GitTrace::finish`] (once every process of the run
/// is gone) returns what the events said.
#[derive(Debug)]
pub struct GitTrace {
    path: PathBuf,
    /// Closing it wakes the thread, which reads what is left and ends.
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<Vec<Failure>>>,
}

impl GitTrace {
    /// Binds a socket under a fresh name in `dir` (the run's private TMPDIR) and starts
    /// reading it. `None` when that cannot be done (a path too long for a socket, no thread):
    /// the run goes on without the lines.
    #[cfg(not(target_os = "linux"))]
    pub fn listen(_dir: &Path) -> Option<Self> {
        None
    }

    /// [`GitTrace::listen`] on Linux.
    #[cfg(target_os = "linux")]
    pub fn listen(dir: &Path) -> Option<Self> {
        use std::os::unix::net::UnixListener;
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).ok()?;
        let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let path = dir.join(format!(".sandbox-git-trace-{name}"));
        // sun_path holds 108 bytes with its NUL.
        if path.as_os_str().len() >= 108 {
            return None;
        }
        let socket = match UnixListener::bind(&path) {
            Ok(socket) => socket,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "no git trace socket");
                return None;
            }
        };
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
        let thread = std::thread::Builder::new()
            .name("git-trace".into())
            .spawn(move || read_events(socket, read))
            .ok();
        if thread.is_none() {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        Some(GitTrace {
            path,
            stop: Some(write),
            thread,
        })
    }

    /// The value of `GIT_TRACE2_EVENT` that sends a command's git events here.
    pub fn target(&self) -> OsString {
        let mut value = OsString::from("af_unix:stream:");
        value.push(self.path.as_os_str());
        value
    }

    /// Stops reading (after what is queued) and returns the failures the events reported.
    pub fn finish(mut self) -> Vec<Failure> {
        self.stop.take();
        let failures = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let _ = std::fs::remove_file(&self.path);
        failures
    }
}

impl Drop for GitTrace {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// At most this many git processes are read at once (more wait in the listen backlog, or
/// find it full and trace nothing); a line longer than [`MAX_LINE`] is dropped.
#[cfg(target_os = "linux")]
const MAX_CONNECTIONS: usize = 64;
#[cfg(target_os = "linux")]
const MAX_LINE: usize = 64 << 10;

/// One git process's stream of events, one JSON object a line.
#[cfg(target_os = "linux")]
struct Connection {
    stream: std::os::unix::net::UnixStream,
    line: Vec<u8>,
}

#[cfg(target_os = "linux")]
impl Connection {
    /// Reads what is there; `false` once the process closed it (or it failed).
    fn read(&mut self, collected: &mut Collected, buf: &mut [u8]) -> bool {
        use std::io::Read;
        loop {
            match self.stream.read(buf) {
                Ok(0) => return false,
                Ok(n) => {
                    for part in buf[..n].split_inclusive(|b| *b == b'\n') {
                        self.line.extend_from_slice(part);
                        if self.line.ends_with(b"\n") {
                            collected.event(&self.line);
                            self.line.clear();
                        } else if self.line.len() > MAX_LINE {
                            self.line.clear();
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// Reads events until `stop`'s writer closes, then what is still there. A stream socket,
/// not datagrams: each git process connects once and writes its events without waiting for
/// this thread (a datagram socket holds 10 messages, and git waits on every one beyond).
#[cfg(target_os = "linux")]
fn read_events(listener: std::os::unix::net::UnixListener, stop: OwnedFd) -> Vec<Failure> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut collected = Collected::default();
    let mut buf = vec![0u8; 64 << 10];
    let mut connections: Vec<Connection> = Vec::new();
    if listener.set_nonblocking(true).is_err() {
        return Vec::new();
    }
    let accept = |connections: &mut Vec<Connection>| {
        while let Ok((stream, _)) = listener.accept() {
            if connections.len() < MAX_CONNECTIONS && stream.set_nonblocking(true).is_ok() {
                connections.push(Connection {
                    stream,
                    line: Vec::new(),
                });
            }
        }
    };
    loop {
        let (stopping, ready) = {
            let mut fds = vec![
                PollFd::new(stop.as_fd(), PollFlags::POLLIN),
                PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            ];
            fds.extend(
                connections
                    .iter()
                    .map(|c| PollFd::new(c.stream.as_fd(), PollFlags::POLLIN)),
            );
            if poll(&mut fds, PollTimeout::NONE).is_err() {
                continue;
            }
            let ready: Vec<bool> = fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            (ready[0], ready)
        };
        // Once stopping, every process of the run is gone: read everything there is.
        let mut i = 0;
        connections.retain_mut(|c| {
            i += 1;
            !(stopping || ready[i + 1]) || c.read(&mut collected, &mut buf)
        });
        accept(&mut connections);
        if stopping {
            for mut c in connections.drain(..) {
                c.read(&mut collected, &mut buf);
            }
            return collected.failures();
        }
    }
}

/// What the host knows when it explains failures: the repository's common dir and the refs
/// it pinned read-only inside.
#[derive(Debug, Clone)]
pub struct Pins<'a> {
    pub common: &'a Path,
    pub pinned_refs: &'a [String],
    /// The push remotes the run may reach (`--allow-push`), as git dirs.
    pub push_remotes: &'a [PathBuf],
}

/// The git dir of the repository at `path` on this machine (a bare one, or a worktree's
/// `.git` directory), canonical.
pub fn local_repository(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let path = std::fs::canonicalize(path).ok()?;
    let dot_git = path.join(".git");
    if dot_git.is_dir() {
        return Some(dot_git);
    }
    ["HEAD", "objects", "refs"]
        .iter()
        .all(|n| path.join(n).exists())
        .then_some(path)
}

/// A command line for a message: `git` for git's own path, words quoted for a shell.
fn command_line(argv: &[String]) -> String {
    let mut words = argv.iter().map(|w| {
        let plain = !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@+%^~,".contains(&b));
        if plain {
            w.clone()
        } else {
            format!("'{}'", w.replace('\'', "'\\''"))
        }
    });
    let first = match words.next() {
        Some(w) if w.rsplit('/').next() == Some("git") => "git".to_string(),
        Some(w) => w,
        None => "git".to_string(),
    };
    std::iter::once(first)
        .chain(words)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `msg` names `path` (followed by a quote, a colon, a space or its end: not a
/// longer name that starts with it).
fn names_path(msg: &str, path: &Path) -> bool {
    let path = path.to_string_lossy();
    msg.match_indices(path.as_ref()).any(|(at, _)| {
        msg[at + path.len()..]
            .chars()
            .next()
            .is_none_or(|c| matches!(c, '\'' | '"' | ':' | ' ' | ','))
    })
}

/// One line per failed command whose message names a ref the host pinned (one that is not
/// the task's); or a push whose `receive-pack` failed on a
/// path that `local_repository` (which asks the host) says is the git dir of a repository
/// on this machine, not one of the run's push remotes. Pure but for `local_repository`.
pub fn explain(
    failures: &[Failure],
    pins: &Pins<'_>,
    local_repository: &dyn Fn(&Path) -> Option<PathBuf>,
) -> Vec<String> {
    let mut lines = BTreeSet::new();
    let mut ordered = Vec::new();
    for failure in failures {
        let cmd = command_line(&failure.argv);
        let line = pins
            .pinned_refs
            .iter()
            .find(|name| {
                failure
                    .errors
                    .iter()
                    .any(|m| names_path(m, &pins.common.join(name)))
            })
            .map(|name| {
                format!(
                    "git: `{cmd}` failed inside because {name} is not this task's: the \
                     sandbox keeps the repository's other refs read-only (only the task \
                     branch and refs this worktree's runs created may change); run `{cmd}` \
                     on the host if you want it"
                )
            });
        let line = line.or_else(|| {
            failure.pushed_to.iter().find_map(|path| {
                let named = failure.errors.iter().any(|m| m.contains(path.as_str()));
                let gitdir = local_repository(Path::new(path))?;
                (named && !pins.push_remotes.contains(&gitdir)).then(|| {
                    let arg = command_line(&["git".into(), path.clone()]);
                    let arg = arg.trim_start_matches("git ");
                    format!(
                        "git: `{cmd}` failed inside because {path} is a repository on this \
                         machine, which a run may not write: to push there through a \
                         quarantine (the host takes in new branches and tags, the remote's \
                         hooks and config stay read-only), run again with `--allow-push {arg}`"
                    )
                })
            })
        });
        if let Some(line) = line {
            if lines.insert(line.clone()) && ordered.len() < 8 {
                ordered.push(line);
            }
        }
    }
    ordered
}

#[cfg(test)]
mod tests;
