//! `sandbox doctor`: what each backend can do on this machine, and why not where not.

use sandbox_host::seam::{self, BackendKind};
use serde_json::json;

use crate::cli::args::DoctorArgs;
use crate::context::Context;
use crate::tools;

fn wrap(text: &str, first: &str, rest: &str) -> String {
    crate::text::wrap(text, crate::text::WIDTH, first, rest)
}

/// Whether the native backend can build its private view here (the seam's real probe,
/// cached in the private directory).
fn private_view(ctx: &Context) -> serde_json::Value {
    let options = sandbox_host::BackendOptions {
        private_dir: Some(ctx.dirs.runtime.clone()),
        state_dir: Some(ctx.dirs.state.clone()),
        ..sandbox_host::BackendOptions::default()
    };
    match sandbox_host::backends::native::private_view(&options) {
        // Where a run's quarantine layers would go (a tmpfs before Linux 6.6 takes no
        // user.* xattrs, so they may go to disk), or why nowhere.
        Ok(()) => match sandbox_host::backends::native::quarantine_layers(&options) {
            Ok((dir, why)) => json!({"available": true, "layers": {"dir": dir, "why": why}}),
            Err(error) => json!({"available": true, "layers": {"error": error}}),
        },
        Err(reason) => json!({"available": false, "reason": reason}),
    }
}

pub fn run(args: DoctorArgs, ctx: &Context) -> anyhow::Result<i32> {
    // A representative policy: a scratch workspace with the network blocked, so the report
    // covers filesystem, TCP and scoping rules.
    // The daemon's `host.describe` judges availability with the same sample and function.
    let scratch = tempfile::tempdir()?;
    let sample = seam::sample_policy(scratch.path(), ctx.config().service.hook_port)?;

    let options = crate::session::backend_options(ctx, None);
    let backends: Vec<serde_json::Value> = BackendKind::ALL
        .iter()
        .map(|&kind| serde_json::to_value(ctx.backends.availability(kind, &sample, &options)))
        .collect::<Result<_, _>>()?;

    let nono_cfg = ctx
        .config()
        .backends
        .nono
        .path
        .as_deref()
        .map(crate::config::expand_home);
    let tools: Vec<tools::ToolPath> = tools::ALL
        .iter()
        .map(|t| {
            let configured = if t.name == "nono" {
                nono_cfg.as_deref()
            } else {
                None
            };
            t.resolve_with_version(configured)
        })
        .collect();

    let view = private_view(ctx);
    let dir = crate::session::workdir(args.workdir.as_deref())?;
    let worktree = match sandbox_policy::git::discover(&dir) {
        Ok(None) => json!({"path": dir, "git": "none", "protected": true}),
        Ok(Some(found)) => {
            // With the private view, read-only binds protect a main worktree too; without
            // it only a linked worktree's layout is protectable by Landlock.
            let problem = if view["available"] == json!(true) {
                found.layout.worktree_config.then(|| {
                    "extensions.worktreeConfig is enabled: git would read a config.worktree the \
                     sandbox can write"
                        .to_string()
                })
            } else {
                found.layout.landlock_protection_problem(&found.root)
            };
            json!({
                "path": found.root,
                "git": if found.layout.is_linked { "linked" } else { "main" },
                "common_dir": found.layout.common_dir,
                "protected": problem.is_none(),
                "problem": problem,
            })
        }
        Err(e) => json!({"path": dir, "git": "error", "problem": e.to_string()}),
    };

    let home = match crate::commands::home::locate(ctx, &dir) {
        Ok((home_dir, layers, _)) => {
            let (home_bytes, layers_bytes) = crate::commands::home::usage(&home_dir, &layers);
            json!({"dir": home_dir, "bytes": home_bytes, "cache_layers": layers,
                   "cache_layer_bytes": layers_bytes,
                   "off": ctx.config().home.as_deref() == Some("off")})
        }
        Err(e) => json!({"error": e.to_string()}),
    };
    let boxlite = boxlite_report(ctx);
    // Which resource limits this machine can enforce for native, nono and custom, and how.
    // The native backend's view (a user namespace per command) can hold the process limit
    // where no cgroup can.
    let machine = sandbox_host::limits::for_run(
        sandbox_host::limits::probe(),
        sandbox_host::BackendKind::Native,
        &options,
    );
    let limits_lines = sandbox_host::limits::describe_machine(&machine);
    let report = json!({
        "limits": {"machine": machine, "lines": limits_lines},
        "home": home,
        "boxlite": boxlite,
        "private_view": view,
        "backends": backends,
        "tools": tools,
        "worktree": worktree,
        "config": ctx.loaded.sources,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    for b in &backends {
        let name = b["name"].as_str().unwrap_or("?");
        if name == "boxlite" {
            // Its own section below: files, KVM and the boot probe.
            continue;
        }
        if b["available"].as_bool() == Some(true) {
            let e = &b["enforcement"];
            let abi = e["landlock_abi"]
                .as_i64()
                .map(|a| format!(", Landlock ABI {a}"))
                .unwrap_or_default();
            println!(
                "{name:<8} available ({}{abi})",
                e["mechanism"].as_str().unwrap_or("")
            );
            for item in e["enforced"].as_array().into_iter().flatten() {
                let item = item.as_str().unwrap_or("");
                if name == "native" && item.starts_with("seccomp:") {
                    // The rules themselves, one reason a line, instead of the reasons alone.
                    println!("         - seccomp (denied with EPERM unless named):");
                    let plan = sandbox_policy::compile::seccomp::compile(&sample);
                    for line in sandbox_policy::compile::seccomp::describe(&plan) {
                        print!("{}", wrap(&line, "             ", "                 "));
                    }
                    continue;
                }
                print!("{}", wrap(item, "         - ", "           "));
            }
            for note in e["notes"].as_array().into_iter().flatten() {
                print!(
                    "{}",
                    wrap(
                        note.as_str().unwrap_or(""),
                        "         note: ",
                        "               "
                    )
                );
            }
            for downgrade in e["downgrades"].as_array().into_iter().flatten() {
                println!(
                    "         ! layer missing: {}",
                    downgrade.as_str().unwrap_or("")
                );
            }
        } else if b["degraded"].as_bool() == Some(true) {
            // Judged on a sample that blocks the network: a gap may concern only runs that
            // need it (TCP port rules for --block-net), so what holds is listed too.
            println!(
                "{name:<8} DEGRADED: runs that need what is listed as not enforced fail closed \
                 unless --allow-degraded"
            );
            let e = &b["enforcement"];
            for item in e["enforced"].as_array().into_iter().flatten() {
                print!(
                    "{}",
                    wrap(item.as_str().unwrap_or(""), "         - ", "           ")
                );
            }
            for gap in e["gaps"].as_array().into_iter().flatten() {
                print!(
                    "{}",
                    wrap(
                        gap.as_str().unwrap_or(""),
                        "         ! not enforced: ",
                        "                         "
                    )
                );
            }
            for downgrade in e["downgrades"].as_array().into_iter().flatten() {
                println!(
                    "         ! layer missing: {}",
                    downgrade.as_str().unwrap_or("")
                );
            }
        } else {
            println!(
                "{name:<8} not available: {}",
                b["reason"].as_str().unwrap_or("unknown")
            );
        }
        if name == "native" {
            if let Some(rights) = b["enforcement"]["fs_rights_enforced"].as_array() {
                let rights: Vec<&str> = rights.iter().filter_map(|r| r.as_str()).collect();
                println!("         filesystem rights: {}", rights.join(" "));
            }
        }
    }
    print_boxlite(&boxlite);
    match view["available"].as_bool() {
        Some(true) => {
            println!(
                "\nprivate view: available (native runs in user + mount namespaces where only \
                 the policy's paths exist)"
            );
            let layers = &view["layers"];
            match layers["error"].as_str() {
                Some(error) => println!("  ! git store quarantine: {error}"),
                None => println!(
                    "  git store quarantine layers: {} ({})",
                    layers["dir"].as_str().unwrap_or("?"),
                    layers["why"].as_str().unwrap_or("")
                ),
            }
        }
        _ => println!(
            "\nprivate view: NOT available: {}\n  native falls back to Landlock + seccomp and \
             denies unix sockets (--allow-unix-sockets to allow them); to enable user \
             namespaces see docs/backends.md#user-namespaces",
            view["reason"].as_str().unwrap_or("unknown")
        ),
    }
    println!("\nresource limits (native, nono, custom; --memory, --pids, --cpus, `limits:`):");
    for line in &limits_lines {
        println!("  {line}");
    }
    println!("\ntools:");
    for t in &tools {
        match &t.path {
            Some(p) => println!(
                "  {:<11} {} ({:?}{})",
                t.name,
                p.display(),
                t.source,
                t.version
                    .as_ref()
                    .map(|v| format!(", {v}"))
                    .unwrap_or_default()
            ),
            None => println!(
                "  {:<11} not found (set {} or install it)",
                t.name, t.variable
            ),
        }
    }
    println!("\nworktree {}:", worktree["path"].as_str().unwrap_or("?"));
    match worktree["git"].as_str() {
        Some("none") => println!("  not a git repository"),
        Some(kind) => {
            if worktree["protected"].as_bool() == Some(true) {
                println!("  {kind} worktree: git hooks and config are read-only in the sandbox");
            } else {
                println!(
                    "  {kind} worktree: NOT protectable by Landlock: {}",
                    worktree["problem"].as_str().unwrap_or("")
                );
            }
        }
        None => {}
    }
    if let Some(dir) = home["dir"].as_str() {
        let size = |v: &serde_json::Value| {
            v.as_u64().map_or(
                "not created yet".to_string(),
                sandbox_host::assembly::home::human_bytes,
            )
        };
        println!(
            "  private home {}: {}; cache layers {}{}",
            dir,
            size(&home["bytes"]),
            size(&home["cache_layer_bytes"]),
            if home["off"] == json!(true) {
                " (home: off)"
            } else {
                ""
            }
        );
    }
    if !ctx.loaded.sources.is_empty() {
        let files: Vec<String> = ctx
            .loaded
            .sources
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        println!("\nconfiguration: {}", files.join(", "));
    }
    Ok(0)
}

/// BoxLite: whether it is built, its runtime files (each with its hash), the KVM device, and
/// whether this host can boot its guests — a real boot of a throwaway box, remembered in the
/// runtime directory for this kernel and BoxLite version (it takes seconds, and the answer
/// changes only with them).
fn boxlite_report(ctx: &Context) -> serde_json::Value {
    use sandbox_boxlite::{host, runtime_files};
    let location = runtime_files::locate();
    let files = location
        .as_ref()
        .map(|l| runtime_files::check_dir(&l.dir))
        .unwrap_or_default();
    let files_ok = !files.is_empty() && files.iter().all(|f| f.is_ok());
    let kvm = host::kvm_device(std::path::Path::new("/dev/kvm"));
    let kvm_bootable = host::kvm_bootable(std::path::Path::new("/dev/kvm"));
    let boot = if !sandbox_boxlite::IN_BUILD {
        host::probe_boot(None, None)
    } else if location.is_none() {
        host::BootProbe {
            can_boot: false,
            detail: sandbox_boxlite::BoxliteError::RuntimeNotFound.to_string(),
            reason: Some("runtimeNotFound".into()),
            elapsed_ms: 0,
        }
    } else if !files_ok {
        host::BootProbe {
            can_boot: false,
            detail: "the runtime files do not match their pins (see files)".into(),
            reason: Some("runtimeFilesMismatch".into()),
            elapsed_ms: 0,
        }
    } else {
        cached_boot_probe(ctx, location.clone())
    };
    json!({
        "inBuild": sandbox_boxlite::IN_BUILD,
        "version": sandbox_boxlite::VERSION,
        "runtime": location,
        "files": files,
        "kvm": kvm,
        "kvmBootable": kvm_bootable,
        "boot": boot,
    })
}

fn cached_boot_probe(
    ctx: &Context,
    location: Option<sandbox_boxlite::runtime_files::RuntimeLocation>,
) -> sandbox_boxlite::host::BootProbe {
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let key = format!("{} {kernel}", sandbox_boxlite::VERSION);
    let cache = ctx.dirs.runtime.join("boxlite-boot-probe.json");
    if let Ok(text) = std::fs::read_to_string(&cache) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
            if v["key"] == json!(key) {
                if let Ok(probe) = serde_json::from_value(v["probe"].clone()) {
                    return probe;
                }
            }
        }
    }
    let probe =
        sandbox_boxlite::host::probe_boot(location, Some(&ctx.dirs.runtime.join("boxlite-probe")));
    if std::fs::create_dir_all(&ctx.dirs.runtime).is_ok() {
        let _ = std::fs::write(&cache, json!({ "key": key, "probe": probe }).to_string());
    }
    probe
}

fn print_boxlite(b: &serde_json::Value) {
    let version = b["version"].as_str().unwrap_or("?");
    if b["inBuild"] == json!(false) {
        println!(
            "boxlite  not in this build (BoxLite {version}): build with the cargo feature \
             `boxlite` (docs/boxlite.md)"
        );
    } else {
        println!("boxlite  BoxLite {version} microVMs, through the daemon (sandbox exec --backend boxlite)");
    }
    match b["runtime"]["dir"].as_str() {
        Some(dir) => println!(
            "         runtime files: {dir} ({})",
            b["runtime"]["source"].as_str().unwrap_or("")
        ),
        None => println!(
            "         runtime files: not found (run `cargo xtask boxlite-runtime` or set \
             SANDBOX_BOXLITE_RUNTIME)"
        ),
    }
    for f in b["files"].as_array().into_iter().flatten() {
        let status = f["status"].as_str().unwrap_or("?");
        let hash = f["sha256"].as_str().unwrap_or("");
        match status {
            "patched" => println!(
                "           {:<16} sha256 {hash} patched for this system (pinned {})",
                f["name"].as_str().unwrap_or(""),
                f["pinned"].as_str().unwrap_or("")
            ),
            "ok" => println!(
                "           {:<16} sha256 {hash} ok",
                f["name"].as_str().unwrap_or("")
            ),
            other => println!(
                "           {:<16} {other}{}",
                f["name"].as_str().unwrap_or(""),
                f["expected"]
                    .as_str()
                    .map(|e| format!(": sha256 {hash}, expected {e}"))
                    .unwrap_or_default()
            ),
        }
    }
    match b["kvm"]["state"].as_str() {
        Some("usable") => println!("         /dev/kvm: present and usable"),
        Some("missing") => println!("         /dev/kvm: missing"),
        _ => println!(
            "         /dev/kvm: cannot be opened: {}",
            b["kvm"]["detail"].as_str().unwrap_or("")
        ),
    }
    if b["kvm"]["state"].as_str() == Some("usable") {
        println!(
            "         virtualisation: {}",
            b["kvmBootable"]["detail"].as_str().unwrap_or("")
        );
    }
    if b["boot"]["canBoot"] == json!(true) {
        println!(
            "         guests: boot here ({})",
            b["boot"]["detail"].as_str().unwrap_or("")
        );
    } else {
        println!(
            "         guests: CANNOT boot here: {}",
            b["boot"]["detail"].as_str().unwrap_or("")
        );
    }
}
