//! Any frame the daemon sends, as a client reads it.

use serde::Deserialize;
use serde_json::Value;

use crate::boxes::BoxState;
use crate::envelope::Id;
use crate::error::RpcError;
use crate::exec::Encoding;
use crate::output::decode_data;
use crate::report::{GitStoreReport, NetConnection};

/// Any frame the daemon sends, as a client reads it. Lenient (no `deny_unknown_fields`) so
/// that clients keep working when a later daemon adds members.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Incoming {
    /// Present (possibly `null`) on replies; absent on events.
    #[serde(default, deserialize_with = "present")]
    pub id: Option<Option<Id>>,
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub error: Option<RpcError>,
    /// The event kind: `output`, `exit`, `boxState`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub exec_id: Option<u64>,
    #[serde(default)]
    pub stream: Option<String>,
    #[serde(default)]
    pub data: Option<String>,
    #[serde(default)]
    pub encoding: Option<Encoding>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub timed_out: Option<bool>,
    #[serde(default)]
    pub error_message: Option<String>,
    #[serde(default)]
    pub git_store: Option<GitStoreReport>,
    /// An `exit` event's connection log (a run with a domain allow-list).
    #[serde(default)]
    pub connections: Vec<NetConnection>,
    #[serde(default)]
    pub box_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub state: Option<BoxState>,
    #[serde(default)]
    pub elapsed_ms: Option<u64>,
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub step_state: Option<String>,
    #[serde(default)]
    pub step_ms: Option<u64>,
    #[serde(default)]
    pub step_error: Option<String>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<Id>>, D::Error> {
    Option::<Id>::deserialize(d).map(Some)
}

impl Incoming {
    pub fn is_reply(&self) -> bool {
        self.id.is_some()
    }

    /// The bytes of an `output` event.
    pub fn output_bytes(&self) -> Result<Vec<u8>, RpcError> {
        decode_data(
            self.data.as_deref().unwrap_or(""),
            self.encoding.unwrap_or_default(),
        )
    }
}
