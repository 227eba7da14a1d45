//! `sandbox policy show`: the resolved policy and its compiled form — the dry run.

use std::fmt::Write as _;
use std::path::Path;

use sandbox_host::backends::native::NativeForms;
use sandbox_host::seam::{self, BackendKind};
use sandbox_host::Enforcement;
use sandbox_policy::compile;
use sandbox_policy::{NetPolicy, Policy};
use serde_json::json;

use crate::cli::args::PolicyShowArgs;
use crate::context::Context;
use crate::session::Session;

pub fn run(args: PolicyShowArgs, ctx: &Context) -> anyhow::Result<i32> {
    let session = Session::open(&args.sandbox, ctx, false, None)?;
    let policy = &session.policy;
    // The same checks and report a run would get from the seam, without preparing anything.
    let enforcement = seam::check_policy(session.kind, policy, &session.options)
        .and_then(|()| ctx.backends.open(session.kind, &session.options))
        .and_then(|b| b.enforcement(policy));
    // The native backend's compiled forms, asked of the seam as a run here would build them.
    let NativeForms {
        view,
        landlock,
        seccomp,
        own_proc,
    } = sandbox_host::backends::native::native_forms(
        &session.policy,
        &sandbox_host::BackendOptions {
            allow_degraded: args.sandbox.allow_degraded,
            ..session.options.clone()
        },
    );
    let seatbelt = compile::seatbelt::compile(policy);
    let env_names: Vec<String> = session
        .child_env()?
        .into_iter()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    // The resource limits, each with the mechanism a run here gets (or why none).
    let machine = sandbox_host::limits::for_run(
        sandbox_host::limits::probe(),
        session.kind,
        &session.options,
    );
    let limits = sandbox_host::limits::plan_for(policy, session.kind, &machine);
    let limits_refused =
        sandbox_host::limits::check(&limits, session.kind, args.sandbox.allow_degraded).err();
    let refused = match &enforcement {
        Err(e) => Some(e.to_string()),
        Ok(_) if limits_refused.is_some() => limits_refused
            .as_ref()
            .map(|e| format!("{e} (pass --allow-degraded to run anyway)")),
        Ok(e) if !e.gaps.is_empty() && !args.sandbox.allow_degraded => Some(format!(
            "this kernel cannot enforce: {} (pass --allow-degraded to run anyway)",
            e.gaps.join("; ")
        )),
        Ok(_) => None,
    };

    if args.json {
        let compiled = match session.kind {
            BackendKind::Native => json!({
                "view": view.as_ref().map(|v| v.as_ref().map_err(|e| e.to_string())),
                "landlock": landlock.as_ref().map_err(|e| e.to_string()).ok(),
                "seccomp": seccomp,
                "seatbelt": seatbelt,
                "own_proc": own_proc,
            }),
            BackendKind::Nono => match sandbox_host::backends::nono::plan(policy) {
                Ok(plan) => json!({
                    "nono_args": plan.invocation.flags(),
                    "manifest": plan.manifest,
                }),
                Err(e) => json!({"error": e.to_string()}),
            },
            BackendKind::Custom => json!({
                "hints": compile::hints::compile(policy)
                    .into_iter()
                    .collect::<std::collections::BTreeMap<_, _>>(),
            }),
            _ => json!(null),
        };
        let out = json!({
            "backend": session.kind.as_str(),
            "backend_source": session.choice,
            "task": session.task,
            "policy": policy,
            // The network the run gets (`policy.net` is only what was asked for: a
            // credential narrows an open one).
            "network": sandbox_policy::NetMode::of(policy),
            "env_names": env_names,
            "compiled": compiled,
            "enforcement": enforcement.as_ref().ok(),
            "refused": refused,
            "limits": limits,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!(
            "{}",
            human(
                &session,
                enforcement.as_ref().ok(),
                &env_names,
                refused.as_deref(),
                &sandbox_host::limits::describe_plan(policy, session.kind, &limits),
                own_proc
                    .as_deref()
                    .filter(|_| session.kind == BackendKind::Native),
            )
        );
        if session.kind == BackendKind::Nono {
            match sandbox_host::backends::nono::plan(policy) {
                Ok(plan) => println!(
                    "\nnono manifest (run as `nono {} -c <private file> -- <command>`):\n{}",
                    plan.invocation.flags().join(" "),
                    plan.manifest_json()
                ),
                Err(e) => println!("\nnono manifest: cannot be compiled: {e}"),
            }
        }
        if session.kind == BackendKind::Custom {
            println!("\nlauncher hints (advisory; the launcher owns the boundary):");
            for (name, value) in compile::hints::compile(policy) {
                println!("  {name}={value}");
            }
        }
        if session.kind == BackendKind::Native {
            if cfg!(target_os = "macos") {
                println!("\nSeatbelt profile:\n{seatbelt}");
            } else if let Ok(plan) = &landlock {
                match &view {
                    Some(Ok(view)) => {
                        println!("\nprivate view (only these paths exist; `/` is read-only):");
                        for op in &view.ops {
                            println!("  {}", describe_mount(op, own_proc.as_deref()));
                        }
                    }
                    Some(Err(e)) => println!("\nprivate view: cannot be compiled: {e}"),
                    None => {
                        println!("\nprivate view: not available here (see `enforced here` above)")
                    }
                }
                println!("\nLandlock rules:");
                for rule in &plan.paths {
                    let mode = match rule.access {
                        compile::landlock::Access::ReadExec => "read ",
                        compile::landlock::Access::ReadWrite => "write",
                        compile::landlock::Access::Device => "dev  ",
                    };
                    println!("  {mode}  {}  ({})", rule.path.display(), rule.why);
                }
                match &plan.tcp {
                    None => println!("  tcp    unrestricted"),
                    Some(tcp) => println!("  tcp    connect/bind only to ports {:?}", tcp.connect),
                }
                println!(
                    "  scope  signals: {}, abstract unix sockets: {}",
                    if plan.scope_signals {
                        "own sandbox only"
                    } else {
                        "any"
                    },
                    if plan.scope_abstract_unix {
                        "own sandbox only"
                    } else {
                        "any"
                    }
                );
                println!("\nseccomp (denied with EPERM unless named):");
                for line in compile::seccomp::describe(&seccomp) {
                    print!(
                        "{}",
                        crate::text::wrap(&line, crate::text::WIDTH, "  ", "      ")
                    );
                }
            }
        }
    }
    Ok(if refused.is_some() { 125 } else { 0 })
}

/// One mount of the view, as `policy show` lists it; `own_proc`: where the pid namespace's
/// own proc replaces the bind of the host's.
fn describe_mount(op: &compile::view::MountOp, own_proc: Option<&Path>) -> String {
    use compile::view::MountOp;
    match op {
        MountOp::Tmpfs { target, .. } => format!("tmpfs  {}  (private)", target.display()),
        MountOp::Bind { target, .. } if Some(target.as_path()) == own_proc => format!(
            "proc   {}  (the pid namespace's own, read-only: only the run's processes)",
            target.display()
        ),
        MountOp::Bind {
            target,
            readonly,
            why,
            ..
        } => format!(
            "{}  {}  ({why})",
            if *readonly { "ro   " } else { "rw   " },
            target.display()
        ),
        MountOp::Symlink { link, target } => {
            format!("link   {} -> {}", link.display(), target.display())
        }
        MountOp::Overlay {
            target, upper, why, ..
        } => format!(
            "ovl    {}  ({why}: writes go to {}, the host applies what is allowed)",
            target.display(),
            upper.display()
        ),
        MountOp::Pin { target, why, .. } => format!("pin    {}  ({why})", target.display()),
        MountOp::Seal { target, why } => format!("seal   {}  ({why})", target.display()),
        MountOp::Empty { target, why } => format!(
            "empty  {}  ({why}; read-only, the host's file is not shown)",
            target.display()
        ),
        MountOp::Devpts { target } => format!(
            "devpts {}  (a private instance: new ptys only, none of the host's)",
            target.display()
        ),
    }
}

/// The agent profile's section: every path it names, its access and why, and what was found.
fn describe_agent(
    agent: &sandbox_policy::AgentGrants,
    copies: &[sandbox_policy::PrivateCopy],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "agent     {} (profile {}), chosen by {}",
        agent.title, agent.agent, agent.selected_by
    );
    for entry in &agent.paths {
        let state = match entry.status.as_str() {
            "missing" => " [not on this machine: nothing granted]".to_string(),
            "created" => " [created]".to_string(),
            "would be created" => " [missing: a run creates it]".to_string(),
            "would be copied" => " [a run gets a private copy]".to_string(),
            "copied" => match copies.iter().find(|c| c.path == entry.path) {
                Some(c) => format!(
                    " [the run writes its copy {}; without a private view, read-only]",
                    c.copy.display()
                ),
                None => String::new(),
            },
            _ => String::new(),
        };
        let audit = match entry.audit {
            Some(sandbox_policy::agents::AgentAudit::Git) => {
                " [its git repositories are audited after every run]"
            }
            None => "",
        };
        let _ = writeln!(
            s,
            "          {:<12}  {}  ({}){state}{audit}",
            entry.access.as_str(),
            entry.path.display(),
            entry.why
        );
    }
    for var in &agent.env {
        let _ = writeln!(
            s,
            "          {:<12}  {}={}  ({})",
            "variable", var.name, var.value, var.why
        );
    }
    for entry in &agent.args {
        let when = match &entry.when_credential {
            Some(c) => format!(", with --credential {c}"),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "          {:<12}  {} {}  ({}{when})",
            "arguments",
            agent.commands.join("|"),
            entry.args.join(" "),
            entry.why
        );
    }
    s
}

fn human(
    session: &Session,
    enforcement: Option<&Enforcement>,
    env_names: &[String],
    refused: Option<&str>,
    limits: &[String],
    own_proc: Option<&Path>,
) -> String {
    let p: &Policy = &session.policy;
    let mut s = String::new();
    let mechanism = enforcement.map(|e| e.mechanism.as_str()).unwrap_or("?");
    let _ = writeln!(
        s,
        "backend   {} ({mechanism}), chosen by {}",
        session.kind,
        session.choice.as_str()
    );
    let _ = writeln!(
        s,
        "task      {}  ({})",
        session.task,
        p.workspace.root.display()
    );
    let _ = writeln!(s, "cwd       {}", p.workspace.cwd.display());
    match &p.workspace.git {
        None => {
            let _ = writeln!(s, "git       not a repository");
        }
        Some(g) => {
            let kind = if g.is_linked {
                "linked worktree"
            } else {
                "main worktree"
            };
            let _ = writeln!(
                s,
                "git       {kind}; common dir {}{}",
                g.common_dir.display(),
                if g.worktree_config {
                    "; extensions.worktreeConfig ON"
                } else {
                    ""
                }
            );
        }
    }
    for (label, grants) in [("write", &p.fs.write), ("read", &p.fs.read)] {
        for (i, g) in grants.iter().enumerate() {
            let _ = writeln!(
                s,
                "{:<9} {}  ({})",
                if i == 0 { label } else { "" },
                g.path.display(),
                g.reason.as_str()
            );
        }
    }
    // Files host tools run: read-only inside (the view), checked after every run.
    let (open, kept): (Vec<_>, Vec<_>) = p
        .workspace
        .host_files
        .iter()
        .partition(|f| f.granted.is_some());
    if !kept.is_empty() {
        let names: Vec<&str> = kept.iter().map(|f| f.name.as_str()).collect();
        let _ = writeln!(
            s,
            "protected {}  (host tools run them: read-only, checked after the run; \
             --allow-write PATH opens one)",
            names.join(" ")
        );
    }
    for f in open {
        let _ = writeln!(s, "          {}  (writable: a grant opened it)", f.name);
    }
    if let Some(agent) = &p.agent {
        let _ = write!(s, "{}", describe_agent(agent, &p.fs.copies));
    }
    let sys: Vec<String> =
        p.fs.system_read
            .iter()
            .filter(|d| Some(d.as_path()) != own_proc)
            .map(|d| d.display().to_string())
            .collect();
    let _ = writeln!(s, "system    {}  (read-only)", sys.join(" "));
    if let Some(proc) = own_proc {
        let _ = writeln!(
            s,
            "proc      {}  (the pid namespace's own: only the run's processes)",
            proc.display()
        );
    }
    let dev: Vec<String> =
        p.fs.devices
            .iter()
            .map(|d| d.display().to_string())
            .collect();
    let _ = writeln!(s, "devices   {}", dev.join(" "));
    // The network the run gets: the value the native backend builds its namespace from.
    let mode = sandbox_policy::NetMode::of(p);
    let _ = writeln!(s, "network   {}", mode.summary());
    if let NetPolicy::Block { .. } = p.net {
        let _ = writeln!(
            s,
            "          TCP only to ports {:?}{}; no UDP, raw sockets or io_uring",
            mode.ports,
            p.hook_port
                .map(|h| format!(" (hook port {h})"))
                .unwrap_or_default()
        );
    }
    if !p.allow_domains.is_empty() {
        let _ = writeln!(s, "domains   {}", p.allow_domains.join(" "));
    }
    if !p.credentials.is_empty() {
        let _ = writeln!(
            s,
            "credentials {} (secrets stay on the host; the command holds placeholders)",
            p.credentials.join(" ")
        );
        for spec in &p.credentials {
            let lines = match sandbox_net::credentials::definition_for_run(spec) {
                Ok(def) => std::iter::once(format!(
                    "{}: {} through ${} (the proxy's /cred/{}); a direct connection to it \
                     only with --allow-domain {}",
                    def.name,
                    def.upstream_url(),
                    def.base_url_var().unwrap_or("its base URL"),
                    def.name,
                    def.host
                ))
                .chain(def.routes.iter().map(|r| {
                    format!(
                        "{}: {} through {}; a direct connection to it only with \
                         --allow-domain {}",
                        def.name,
                        r.upstream_url(),
                        r.reached_by(),
                        r.host
                    )
                }))
                .collect(),
                Err(e) => vec![format!("{spec}: {e}")],
            };
            for line in lines {
                let _ = writeln!(s, "          {line}");
            }
        }
    }
    for (i, line) in network_by_backend(p).iter().enumerate() {
        let label = if i == 0 { "net by" } else { "" };
        let _ = writeln!(s, "{label:<9} {line}");
    }
    let _ = writeln!(s, "env       {}", env_names.join(" "));
    let _ = writeln!(
        s,
        "timeout   {}",
        p.limits
            .timeout
            .map(|t| humantime::format_duration(t).to_string())
            .unwrap_or_else(|| "none".into())
    );
    for (i, line) in limits.iter().enumerate() {
        let _ = writeln!(
            s,
            "{}{line}",
            if i == 0 { "limits    " } else { "          " }
        );
    }
    if let Some(home) = &p.fs.home {
        let layers: u64 = home
            .caches
            .iter()
            .map(|c| sandbox_host::assembly::home::disk_usage(&c.upper))
            .sum();
        let _ = writeln!(
            s,
            "home      {} at {}  ({}, {}; cache layers {})",
            home.dir.display(),
            home.path.display(),
            home.scope,
            sandbox_host::assembly::home::human_bytes(sandbox_host::assembly::home::disk_usage(
                &home.dir
            )),
            sandbox_host::assembly::home::human_bytes(layers)
        );
        let on: Vec<&str> = home
            .toolchains
            .iter()
            .filter(|t| t.enabled)
            .map(|t| t.name.as_str())
            .collect();
        let off: Vec<&str> = home
            .toolchains
            .iter()
            .filter(|t| !t.enabled)
            .map(|t| t.name.as_str())
            .collect();
        let _ = writeln!(
            s,
            "toolchains {}{}",
            if on.is_empty() {
                "none".to_string()
            } else {
                on.join(" ")
            },
            if off.is_empty() {
                String::new()
            } else {
                format!("  (not mounted: {})", off.join(" "))
            }
        );
        if !home.caches.is_empty() {
            let names: Vec<&str> = home.caches.iter().map(|c| c.name.as_str()).collect();
            let _ = writeln!(s, "caches    {}  (copy-on-write)", names.join(" "));
        }
        for m in &home.masked {
            let _ = writeln!(s, "left out  {}  ({})", m.path.display(), m.what);
        }
    }
    if let Some(e) = enforcement {
        if let Some(abi) = e.landlock_abi {
            let _ = writeln!(s, "\nenforced here (Landlock ABI {abi}):");
        } else {
            let _ = writeln!(s, "\nenforced here:");
        }
        for item in &e.enforced {
            let _ = writeln!(s, "  - {item}");
        }
        for gap in &e.gaps {
            let _ = writeln!(s, "  ! NOT enforced: {gap}");
        }
        for downgrade in &e.downgrades {
            let _ = writeln!(s, "  ! layer missing on this machine: {downgrade}");
        }
        for note in &e.notes {
            let _ = writeln!(s, "  note: {note}");
        }
    }
    if let Some(r) = refused {
        let _ = writeln!(
            s,
            "\nREFUSED: a run with these options would not start: {r}"
        );
    }
    s
}

/// What each backend enforces of a network that is not fully open (`policy show`): the same
/// rules, by each one's own mechanism, or a refusal where it has none.
pub fn network_by_backend(p: &sandbox_policy::Policy) -> Vec<String> {
    let blocked = matches!(p.net, NetPolicy::Block { .. });
    // A credential's proxy is the way out as a domain list's is (`NetMode`).
    let domains = sandbox_policy::NetMode::of(p).proxied();
    if !blocked && !domains {
        return Vec::new();
    }
    let mut lines = vec![format!(
        "native   a network namespace of its own (only loopback; --allow-port and the hook \
         port relayed from the host's 127.0.0.1){}; without user namespaces: Landlock TCP \
         ports + seccomp{}",
        if domains {
            " + the supervisor's proxy for the domain list (HTTP_PROXY/HTTPS_PROXY) and the \
             credentials' /cred/NAME"
        } else {
            ""
        },
        if domains {
            ", and --allow-domain and --credential are refused"
        } else {
            ""
        }
    )];
    if !p.credentials.is_empty() {
        lines.push(
            "others   refused: only the native backend's proxy adds a credential on the way"
                .to_string(),
        );
        return lines;
    }
    lines.push(if domains {
        "nono     its proxy (network.mode proxy with the domain list)".to_string()
    } else {
        "nono     its network block (TCP ports by Landlock)".to_string()
    });
    lines.push(if domains {
        "boxlite  the box's allowNet (box.create allowNet in the daemon; not from this list)"
            .to_string()
    } else {
        "boxlite  the box's blockNet".to_string()
    });
    lines.push(
        "lima     refused: the VM's network cannot be restricted by the host yet".to_string(),
    );
    lines
}
