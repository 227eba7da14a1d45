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
    let response = sandbox_box::hooks::client::post_status(
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
#[derive(Debug, Clone)]
pub struct HookLease {
    pub url: String,
    pub port: u16,
    pub token: String,
}

/// Asks the running daemon (if any) for a token that may post status for `task` only. No
/// daemon, or any failure, means no hook: the run goes on without one.
pub fn lease(ctx: &crate::context::Context, task: &str) -> Option<HookLease> {
    use sandbox_box::protocol::{Request, TokenIssueParams};
    let paths = sandbox_box::RuntimePaths::new(&ctx.dirs.runtime);
    if !paths.socket().exists() {
        return None;
    }
    // Task names on the wire are 1-64 of [A-Za-z0-9._-].
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
    let result = sandbox_box::Client::connect_authenticated(&paths, "sandbox run")
        .and_then(|mut client| client.call(&Request::TokenIssue(TokenIssueParams { task: name })));
    match result {
        Ok(v) => Some(HookLease {
            url: v["url"].as_str()?.to_string(),
            port: u16::try_from(v["port"].as_u64()?).ok()?,
            token: v["token"].as_str()?.to_string(),
        }),
        Err(e) => {
            tracing::debug!(error = %e, "no status hook for this run");
            None
        }
    }
}
