//! `sandbox home`: the private home of this task (or project) — where it is, the disk it and its cache
//! layers take, the toolchains this machine has — and `sandbox home reset`.

use std::path::{Path, PathBuf};

use sandbox_host::assembly::home;

use crate::cli::args::{HomeAction, HomeArgs};
use crate::context::Context;
use crate::exit::Failure;
use crate::session::workdir;

/// The project's home and cache-layer directories, as a run would key them.
pub(crate) fn locate(
    ctx: &Context,
    dir: &Path,
) -> anyhow::Result<(PathBuf, PathBuf, sandbox_policy::Policy)> {
    let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
        workdir: dir.to_path_buf(),
        ..Default::default()
    })?;
    let key = home::home_key(&policy, crate::session::home_per_task(ctx));
    Ok((
        home::homes_dir(&ctx.dirs.state).join(&key),
        home::caches_dir(&ctx.dirs.state).join(&key),
        policy,
    ))
}

pub fn run(args: HomeArgs, ctx: &Context) -> anyhow::Result<i32> {
    let dir = workdir(args.workdir.as_deref())?;
    let (home_dir, layers, policy) = locate(ctx, &dir)?;
    match args.action.unwrap_or(HomeAction::Show) {
        HomeAction::Show => show(ctx, &home_dir, &layers, &policy, args.json),
        HomeAction::Reset { caches, yes } => reset(&home_dir, &layers, caches, yes),
    }
}

fn show(
    ctx: &Context,
    home_dir: &Path,
    layers: &Path,
    policy: &sandbox_policy::Policy,
    json: bool,
) -> anyhow::Result<i32> {
    let off = ctx.config().home.as_deref() == Some("off");
    // What the home is shared with: see `session::home_per_task`.
    let (scope, shared_by) = if crate::session::home_per_task(ctx) {
        ("per-task", "this worktree's own")
    } else {
        ("per-project", "shared by every worktree of the repository")
    };
    let home_bytes = home_dir.is_dir().then(|| home::disk_usage(home_dir));
    let mut caches: Vec<(String, u64)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(layers) {
        for e in entries.filter_map(Result::ok) {
            let upper = e.path().join("upper");
            if upper.is_dir() {
                caches.push((
                    e.file_name().to_string_lossy().into_owned(),
                    home::disk_usage(&upper),
                ));
            }
        }
    }
    caches.sort();
    let real = home::real_home();
    let found = real
        .as_deref()
        .map(|h| home::detect_here(h, &policy.fs.system_read))
        .unwrap_or_default();
    if json {
        let value = serde_json::json!({
            "home": home_dir,
            "scope": scope,
            "exists": home_bytes.is_some(),
            "off": off,
            "bytes": home_bytes,
            "mounted_at": real,
            "cache_layers": layers,
            "caches": caches.iter().map(|(n, b)| serde_json::json!({"name": n, "bytes": b})).collect::<Vec<_>>(),
            "toolchains": found.iter().map(|t| serde_json::json!({"name": t.name, "kind": t.kind, "paths": t.paths})).collect::<Vec<_>>(),
        });
        println!("{value}");
        return Ok(0);
    }
    if off {
        println!("home      off (`home: off` in the configuration): runs keep your HOME string, without its content");
    }
    match home_bytes {
        Some(bytes) => println!(
            "home      {}  ({shared_by}; {}; mounted at {} in the native view)",
            home_dir.display(),
            home::human_bytes(bytes),
            real.as_deref()
                .map_or("-".into(), |h| h.display().to_string())
        ),
        None => println!(
            "home      {}  ({shared_by}; not created yet: the first run makes it)",
            home_dir.display()
        ),
    }
    if caches.is_empty() {
        println!("caches    none layered yet ({})", layers.display());
    } else {
        let total: u64 = caches.iter().map(|(_, b)| b).sum();
        println!(
            "caches    {}  ({} in all)",
            layers.display(),
            home::human_bytes(total)
        );
        for (name, bytes) in &caches {
            println!("          {name:<16} {}", home::human_bytes(*bytes));
        }
    }
    if found.is_empty() {
        println!("toolchains none found");
    } else {
        println!("toolchains (read-only at their real paths; `toolchains:` or --toolchain/--no-toolchains choose)");
        for t in &found {
            let paths: Vec<String> = t.paths.iter().map(|p| p.display().to_string()).collect();
            println!(
                "          {:<10} {:<10} {}",
                t.name,
                t.kind,
                paths.join(" ")
            );
        }
    }
    Ok(0)
}

fn reset(home_dir: &Path, layers: &Path, caches_only: bool, yes: bool) -> anyhow::Result<i32> {
    let what = if caches_only {
        format!("the cache layers {}", layers.display())
    } else {
        format!(
            "the private home {} and its cache layers",
            home_dir.display()
        )
    };
    // Every run of this project holds the home's users lock shared for its whole life (a
    // daemon's box too, between its commands), and a command the layers' lock.
    let busy = |what: &Path| Failure {
        code: 1,
        message: format!(
            "a sandbox run of this project is using {}; reset once it ends",
            what.display()
        ),
    };
    let _idle = if home_dir.is_dir() {
        Some(home::idle(home_dir).map_err(|_| busy(home_dir))?)
    } else {
        None
    };
    let _lock = if layers.is_dir() {
        let lock = home::lock(layers).map_err(|_| busy(layers))?;
        // A measure of what the last command left writes its figure there.
        let measures = home::bound::hold_measures(layers)
            .map_err(|e| Failure::setup(format!("{}: {e}", layers.display())))?;
        Some((lock, measures))
    } else {
        None
    };
    if !crate::commands::lima::confirm(&format!("Delete {what}?"), yes)? {
        println!("nothing deleted");
        return Ok(1);
    }
    let mut removed = Vec::new();
    let mut targets = vec![layers];
    if !caches_only {
        targets.push(home_dir);
    }
    for dir in targets {
        if dir.exists() {
            home::remove_tree(dir)
                .map_err(|e| Failure::setup(format!("removing {}: {e}", dir.display())))?;
            removed.push(dir.display().to_string());
        }
    }
    if removed.is_empty() {
        println!("nothing to delete");
    } else {
        println!("deleted {}", removed.join(", "));
    }
    Ok(0)
}

/// The disk the project's home and cache layers take (`doctor`): `(home, layers)`.
pub(crate) fn usage(home_dir: &Path, layers: &Path) -> (Option<u64>, u64) {
    let home_bytes = home_dir.is_dir().then(|| home::disk_usage(home_dir));
    let layers_bytes = if layers.is_dir() {
        home::disk_usage(layers)
    } else {
        0
    };
    (home_bytes, layers_bytes)
}
