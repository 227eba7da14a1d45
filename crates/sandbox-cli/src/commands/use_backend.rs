//! `sandbox use [BACKEND]`: remember the backend for a task worktree.

use crate::cli::args::UseArgs;
use crate::context::Context;
use crate::exit::Failure;
use crate::session::{choose_backend, task_root, workdir};
use crate::state;

pub fn run(args: UseArgs, ctx: &Context) -> anyhow::Result<i32> {
    let root = task_root(&workdir(args.workdir.as_deref())?);
    if args.clear {
        state::set_backend(&ctx.dirs.state, &root, None)?;
        if !args.json {
            println!("{}: no backend remembered", root.display());
        } else {
            println!("{}", serde_json::json!({"worktree": root, "backend": null}));
        }
        return Ok(0);
    }
    if let Some(name) = &args.backend {
        // A backend this build does not carry is refused, not remembered for later runs.
        let kind = ctx.backends.parse(name).map_err(|e| Failure {
            code: 2,
            message: e.to_string(),
        })?;
        // Remember the canonical name, so `landlock` and `native` are the same choice.
        state::set_backend(&ctx.dirs.state, &root, Some(kind.as_str()))?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({"worktree": root, "backend": kind.as_str()})
            );
        } else {
            println!("{}: using {kind}", root.display());
        }
        return Ok(0);
    }
    let (kind, choice) = choose_backend(None, ctx, &root)?;
    let (effective, source) = (kind.as_str(), choice.as_str());
    if args.json {
        println!(
            "{}",
            serde_json::json!({"worktree": root, "backend": effective, "source": source})
        );
    } else {
        println!("{}: {effective} (from {source})", root.display());
    }
    Ok(0)
}
