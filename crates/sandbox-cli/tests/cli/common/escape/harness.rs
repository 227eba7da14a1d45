//! The shared harness: what an attack is, its verdict, and the judges and network helpers
//! more than one family uses.

use std::io::Read;
use std::net::TcpListener;
use std::process::Output;
use std::time::Duration;

use super::fixture::Fixture;

pub const MARK: &str = "ATTEMPTED";

/// What happened to one attack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The effect did not happen.
    Blocked,
    /// The effect happened but was undone and reported after the run.
    Repaired,
    /// The effect happened.
    Escaped(String),
    /// The command never ran (the sandbox refused to start): proves nothing.
    NotRun(String),
    /// Could not be tried here: the skip's id (`sandbox_testkit::skip`) and why.
    Skipped(&'static str, String),
}

impl Verdict {
    pub fn short(&self) -> String {
        match self {
            Verdict::Blocked => "blocked".into(),
            Verdict::Repaired => "repaired".into(),
            Verdict::Escaped(_) => "ESCAPED".into(),
            Verdict::NotRun(_) => "not run".into(),
            Verdict::Skipped(..) => "skipped".into(),
        }
    }

    pub fn held(&self) -> bool {
        matches!(self, Verdict::Blocked | Verdict::Repaired)
    }
}

/// One attack: a script, extra flags, and a judge that looks at the world afterwards.
pub struct Attack {
    pub name: &'static str,
    /// Needs an interpreter other than sh (skipped when missing).
    pub needs: Option<&'static str>,
    pub run: fn(&Fixture, &str) -> Verdict,
}

pub(super) fn ran(out: &Output) -> Result<(), Verdict> {
    if String::from_utf8_lossy(&out.stdout).contains(MARK) {
        Ok(())
    } else {
        Err(Verdict::NotRun(crate::common::text(out)))
    }
}

pub(super) fn judge(out: &Output, escaped: bool, what: &str) -> Verdict {
    if let Err(v) = ran(out) {
        return v;
    }
    if escaped {
        Verdict::Escaped(format!("{what}\n{}", crate::common::text(out)))
    } else {
        Verdict::Blocked
    }
}

pub(super) fn block_net_flags(allowed: u16) -> Vec<String> {
    vec![
        "--block-net".into(),
        "--allow-port".into(),
        allowed.to_string(),
    ]
}

pub(super) fn free_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

pub(super) fn accepted(listener: &TcpListener) -> Option<String> {
    listener.set_nonblocking(true).unwrap();
    for _ in 0..50 {
        if let Ok((mut stream, _)) = listener.accept() {
            stream.set_nonblocking(false).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let mut buf = String::new();
            let _ = stream.read_to_string(&mut buf);
            return Some(buf);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}
