//! `sandbox ps`: the daemon's boxes.

use clap::Args;
use sandbox_protocol::{NoParams, Request};
use sandbox_service::registry::BoxInfo;
use sandbox_service::{Client, ClientError, RuntimePaths};

use crate::context::Context;

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Machine-readable output (the protocol's `box.list` result).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PsArgs, ctx: &Context) -> anyhow::Result<i32> {
    let paths = RuntimePaths::new(&ctx.dirs.runtime);
    let mut client = match Client::connect_authenticated(&paths, "sandbox ps") {
        Ok(client) => client,
        Err(ClientError::NoDaemon { .. }) => {
            if args.json {
                println!("[]");
            } else {
                eprintln!("sandbox: no daemon is running (start one with `sandbox serve`)");
            }
            return Ok(0);
        }
        Err(e) => return Err(e.into()),
    };
    let list = client.call(&Request::BoxList(NoParams {}))?;
    let boxes: Vec<BoxInfo> = serde_json::from_value(list.clone())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    println!(
        "{:<20} {:<8} {:<9} {:>5}  {:<28} WORKDIR",
        "NAME", "BACKEND", "STATE", "EXECS", "STATUS"
    );
    for b in boxes {
        let status = b
            .last_status
            .map(|s| match s.message {
                Some(m) => format!("{}: {m}", s.event),
                None => s.event,
            })
            .unwrap_or_else(|| "-".into());
        let status: String = if status.chars().count() > 28 {
            status.chars().take(27).chain(['…']).collect()
        } else {
            status
        };
        println!(
            "{:<20} {:<8} {:<9} {:>5}  {:<28} {}",
            b.name,
            b.backend,
            b.state.as_str(),
            b.running_execs,
            status,
            b.workdir
        );
    }
    Ok(0)
}
