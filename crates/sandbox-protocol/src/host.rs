//! The host's methods: `host.hello`, `host.describe`, `token.issue`, and the parameters of
//! the methods that take none (`box.list`, `shutdown`).

use serde::{Deserialize, Serialize};

/// Parameters that must be an empty object (or absent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HelloParams {
    /// The host token from `$XDG_RUNTIME_DIR/sandbox/host.token`.
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// A name for logs (`"studio"`, `"sandbox ps"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DescribeParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenIssueParams {
    /// The task the token may post status for (`sandbox run` uses the worktree's name).
    pub task: String,
}
