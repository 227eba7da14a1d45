//! The command methods (`box.exec`, `exec.stdin`, `exec.kill`) and the `exit` event that
//! ends a command.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::report::{GitStoreReport, NetConnection};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BoxExecParams {
    pub name: String,
    /// The program (a bare name is looked up on the box's `PATH`); never run through a shell.
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Relative to the workdir, or absolute; must resolve inside the box's grants.
    #[serde(default)]
    pub working_dir: Option<PathBuf>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// A pseudo-terminal. Not offered by this daemon yet: `true` is refused.
    #[serde(default)]
    pub interactive: bool,
    /// Give the command a stdin pipe fed by `exec.stdin` (default); `false` is `/dev/null`.
    #[serde(default = "yes")]
    pub stdin: bool,
}

fn yes() -> bool {
    true
}

/// How `data` is encoded in `exec.stdin` and `output`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// `data` is the bytes themselves (valid UTF-8).
    #[default]
    Utf8,
    /// `data` is standard base64 (RFC 4648, padded) of arbitrary bytes.
    Base64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecStdinParams {
    pub exec_id: u64,
    #[serde(default)]
    pub data: String,
    #[serde(default)]
    pub encoding: Encoding,
    /// Close the command's stdin after writing `data`.
    #[serde(default)]
    pub close: bool,
}

/// A signal by number or name (`"TERM"`, `"SIGKILL"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SignalArg {
    Num(i32),
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecKillParams {
    pub exec_id: u64,
    /// Sent to the command's whole process group. Absent: SIGTERM, then SIGKILL after a grace
    /// period.
    #[serde(default)]
    pub signal: Option<SignalArg>,
}

/// An `exit` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitEvent {
    pub exec_id: u64,
    /// The CLI convention: the command's code, 124 timed out, 128+N killed by signal N.
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// What the git store quarantine applied to the repository and refused (native with the
    /// private view, in a linked worktree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_store: Option<GitStoreReport>,
    /// Every connection the run's domain proxy answered, allowed or refused (native with
    /// `allowDomains`); absent when there was none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<NetConnection>,
}
