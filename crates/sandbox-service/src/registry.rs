//! The box registry: named, reusable sandbox contexts owned by the daemon.
//!
//! A box fixes its backend and [`Policy`] at `box.create`; every `box.exec` in it runs under
//! that policy. Boxes belong to the daemon, not to the connection that created them: any
//! authenticated client sees and uses every box, and a box outlives its creator's connection.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use sandbox_host::{BackendKind, Run};

use sandbox_protocol::{BoxCreateParams, BoxState, ErrorCode, RpcError};

/// The last status an agent posted through the hook endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// One box.
pub struct BoxEntry {
    pub id: String,
    pub name: String,
    pub kind: BackendKind,
    /// The parameters it was created with, normalised (for reuse by name).
    pub params: BoxCreateParams,
    /// Its policy and backend, prepared once at `box.create` (the run sequence's `prepare`);
    /// every `box.exec` is armed in it. A VM box's own handle (boot, stop, removal) is its
    /// run's session (`Run::session`). Holds the box's private TMPDIR, removed when the last
    /// holder (the box, or a command still finishing) lets go.
    pub run: Arc<Run>,
    pub allow_degraded: bool,
    pub state: BoxState,
    /// Its sandbox-scoped hook token.
    pub token: String,
    pub created_at_ms: u64,
    /// Execs currently running in it.
    pub execs: BTreeSet<u64>,
    pub last_status: Option<AgentStatus>,
}

/// What `box.list`, `sandbox ps` and `/api/v1/status` show about a box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoxInfo {
    pub box_id: String,
    pub name: String,
    pub backend: String,
    pub state: BoxState,
    pub workdir: String,
    pub created_at_ms: u64,
    pub running_execs: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<AgentStatus>,
}

impl BoxEntry {
    pub fn info(&self) -> BoxInfo {
        BoxInfo {
            box_id: self.id.clone(),
            name: self.name.clone(),
            backend: self.kind.as_str().to_string(),
            state: self.state,
            workdir: self.run.policy().workspace.root.display().to_string(),
            created_at_ms: self.created_at_ms,
            running_execs: self.execs.len(),
            last_status: self.last_status.clone(),
        }
    }
}

/// All boxes, by name.
#[derive(Default)]
pub struct Registry {
    boxes: BTreeMap<String, BoxEntry>,
}

impl Registry {
    pub fn get(&self, name: &str) -> Result<&BoxEntry, RpcError> {
        self.boxes.get(name).ok_or_else(|| no_such_box(name))
    }

    pub fn get_mut(&mut self, name: &str) -> Result<&mut BoxEntry, RpcError> {
        self.boxes.get_mut(name).ok_or_else(|| no_such_box(name))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.boxes.contains_key(name)
    }

    pub fn insert(&mut self, entry: BoxEntry) {
        self.boxes.insert(entry.name.clone(), entry);
    }

    pub fn remove(&mut self, name: &str) -> Option<BoxEntry> {
        self.boxes.remove(name)
    }

    pub fn list(&self) -> Vec<BoxInfo> {
        self.boxes.values().map(BoxEntry::info).collect()
    }

    pub fn names(&self) -> Vec<String> {
        self.boxes.keys().cloned().collect()
    }
}

fn no_such_box(name: &str) -> RpcError {
    RpcError::new(
        ErrorCode::NoSuchBox,
        format!("no box named {name:?} (box.list shows the boxes; box.create makes one)"),
    )
}

/// Box and task names: 1-64 of `[A-Za-z0-9._-]`, not starting with `.` or `-`, so they are
/// safe in file names, log lines and URLs.
pub fn validate_name(what: &str, name: &str) -> Result<(), RpcError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(RpcError::new(
            ErrorCode::InvalidParams,
            format!(
                "{what} {name:?} is not valid: use 1-64 letters, digits, '.', '_' or '-', not \
                 starting with '.' or '-'"
            ),
        ))
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_restricted() {
        for good in ["a", "task-1", "A.b_c", &"x".repeat(64)] {
            validate_name("box", good).unwrap();
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "a b",
            "ü",
            &"x".repeat(65),
            "..",
            "a\n",
        ] {
            assert!(validate_name("box", bad).is_err(), "{bad:?}");
        }
    }
}
