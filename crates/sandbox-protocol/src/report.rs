//! What an `exit` event reports beside the status: the connections of the run's domain proxy
//! and the git store quarantine's account.

use serde::{Deserialize, Serialize};

/// One connection through a run's domain proxy, as `--report-json` has it too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConnection {
    /// The host as the request named it.
    pub host: String,
    pub port: u16,
    /// `connect` (a tunnel) or `http` (plain HTTP).
    pub kind: String,
    pub allowed: bool,
    /// The allow-list entry that allowed it, or the refusing rule (`not-listed`,
    /// `ip-literal`, `non-public-answer`, …).
    pub rule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The git store quarantine's account of one command: refs applied with compare-and-swap,
/// refs refused (unchanged in the repository), objects taken in by hash.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GitStoreReport {
    pub objects_imported: usize,
    pub applied: Vec<GitRefApplied>,
    pub refused: Vec<GitRefRefused>,
    pub rejected_objects: Vec<GitObjectRejected>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitRefApplied {
    pub name: String,
    /// `null`: created.
    pub old: Option<String>,
    /// `null`: deleted.
    pub new: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitRefRefused {
    pub name: String,
    /// What the command set it to (`null`: deleted).
    pub wanted: Option<String>,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitObjectRejected {
    pub path: String,
    pub reason: String,
}
