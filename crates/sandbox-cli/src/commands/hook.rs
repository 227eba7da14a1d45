//! `sandbox hook <event> [message]`: post an agent status from inside a sandbox.

use anyhow::{bail, Context as _};
use clap::Args;

#[derive(Debug, Args)]
pub struct HookArgs {
    /// The status event: `working`, `idle`, `needs-input`, `done`, … (letters, digits, `.`,
    /// `_`, `:`, `-`).
    pub event: String,
    /// A short human-readable message.
    pub message: Option<String>,
}

pub fn run(args: HookArgs) -> anyhow::Result<i32> {
    let (Some(url), Some(token)) = (
        std::env::var_os("SANDBOX_API_URL"),
        std::env::var_os("SANDBOX_API_TOKEN"),
    ) else {
        bail!(
            "SANDBOX_API_URL and SANDBOX_API_TOKEN are not set: this process is not in a \
             sandbox started while a daemon runs (`sandbox serve`)"
        );
    };
    let url = url.to_string_lossy();
    let response = sandbox_service::hooks::client::post_status(
        &url,
        &token.to_string_lossy(),
        &args.event,
        args.message.as_deref(),
    )
    .context("posting the status hook")?;
    if (200..300).contains(&response.status) {
        Ok(0)
    } else {
        bail!(
            "the hook endpoint refused the status ({}): {}",
            response.status,
            response.body.trim()
        )
    }
}

/// A sandbox-scoped hook token for one `sandbox run`/`shell` task, from the running daemon.
/// The daemon revokes the token when `_connection` closes, so the lease lasts exactly as long
/// as this value (and no longer than this process).
pub struct HookLease {
    pub url: String,
    pub port: u16,
    pub token: String,
    _connection: sandbox_service::Client,
}

impl std::fmt::Debug for HookLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of debug output and logs.
        f.debug_struct("HookLease")
            .field("url", &self.url)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// The running daemon's socket, if one is listening.
fn daemon_paths(ctx: &crate::context::Context) -> Option<sandbox_service::RuntimePaths> {
    let paths = sandbox_service::RuntimePaths::new(&ctx.dirs.runtime);
    paths.socket().exists().then_some(paths)
}

/// Asks the running daemon (if any) for a token that may post status for `task` only. No
/// daemon, or any failure, means no hook: the run goes on without one.
pub fn lease(ctx: &crate::context::Context, task: &str) -> Option<HookLease> {
    use sandbox_protocol::{Request, TokenIssueParams};
    let paths = daemon_paths(ctx)?;
    let request = Request::TokenIssue(TokenIssueParams {
        task: wire_task_name(task),
    });
    let result = sandbox_service::Client::connect_authenticated(&paths, "sandbox run")
        .and_then(|mut client| client.call(&request).map(|reply| (client, reply)));
    match result {
        Ok((client, v)) => Some(HookLease {
            url: v["url"].as_str()?.to_string(),
            port: u16::try_from(v["port"].as_u64()?).ok()?,
            token: v["token"].as_str()?.to_string(),
            _connection: client,
        }),
        Err(e) => {
            tracing::debug!(error = %e, "no status hook for this run");
            None
        }
    }
}

/// The running daemon's hook port, without asking for a token (for showing a policy).
pub fn daemon_hook_port(ctx: &crate::context::Context) -> Option<u16> {
    use sandbox_protocol::{DescribeParams, Request};
    let paths = daemon_paths(ctx)?;
    let mut client = sandbox_service::Client::connect(&paths.socket()).ok()?;
    let reply = client
        .call(&Request::Describe(DescribeParams::default()))
        .ok()?;
    u16::try_from(reply["hookPort"].as_u64()?).ok()
}

/// Task names on the wire are 1-64 of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
fn wire_task_name(task: &str) -> String {
    let mut name: String = task
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() || name.starts_with(['.', '-']) {
        name.insert(0, 't');
        name.truncate(64);
    }
    name
}

#[cfg(test)]
mod tests {
    use super::wire_task_name;

    #[test]
    fn task_names_are_made_wire_safe() {
        assert_eq!(wire_task_name("feature-x"), "feature-x");
        assert_eq!(wire_task_name("my task/ü"), "my-task--");
        assert_eq!(wire_task_name(".hidden"), "t.hidden");
        assert_eq!(wire_task_name(""), "t");
        assert_eq!(wire_task_name(&"a".repeat(100)).len(), 64);
        assert_eq!(wire_task_name(&format!("-{}", "a".repeat(100))).len(), 64);
    }
}
