//! `sandbox view …` — placeholder until the sandbox-views work lands.

use clap::Subcommand;

use crate::context::Context;

#[derive(Debug, Subcommand)]
pub enum ViewCommand {
    /// Create (or reuse) the sandbox view of a task worktree.
    Create,
}

pub fn run(_cmd: ViewCommand, _ctx: &Context) -> anyhow::Result<i32> {
    anyhow::bail!("sandbox views are not implemented yet")
}
