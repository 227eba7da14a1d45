//! `sandbox lima …`: the project's Lima VM by hand (the seed's Project Settings → Sandbox →
//! Lima VM). The mechanism is `sandbox-lima`; this file parses, asks, and prints.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use sandbox_host::seam::{Progress, Step};
use sandbox_lima::{LimaSettings, Project, VmEvent, VmState};

use crate::context::Context;
use crate::exit::Failure;

#[derive(Debug, Subcommand)]
pub enum LimaCommand {
    /// Show the VM's state, its instance name, LIMA_HOME and mounts.
    Status(LimaArgs),
    /// Create the VM (without starting it), from the effective configuration.
    Create(LimaArgs),
    /// Start the VM (creating it first if needed), and check its provisioning.
    Start(LimaArgs),
    /// Stop the VM. Commands running in it end.
    Stop(LimaArgs),
    /// Delete and create the VM again (its disk is discarded; views stay on the host).
    Recreate(LimaArgs),
    /// Delete the VM and its disk.
    Delete(LimaArgs),
    /// Open a login shell in the VM (its home directory, outside any view).
    Console(LimaArgs),
    /// Show the effective instance YAML; --edit edits this project's overrides.
    #[command(
        after_help = "The overrides file may set vmType, arch, images, cpus, memory, disk and \
mountType. Mounts are the sandbox's own (each view and its git data) and cannot be added. \
cpus, memory, a larger disk and new views apply on the next start; vmType, arch, the image \
and a smaller disk need `sandbox lima recreate`.\n\nExample overrides:\n  cpus: 4\n  memory: 8GiB\n  disk: 40GiB"
    )]
    Config(ConfigArgs),
}

#[derive(Debug, Args)]
pub struct LimaArgs {
    /// A worktree of the project. Default: the current directory.
    #[arg(short = 'C', long = "workdir", value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Machine-readable output: progress steps as JSON events, then the result.
    #[arg(long)]
    pub json: bool,
    /// Do not ask before a destructive step (recreate, delete, a change that needs a recreate).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub common: LimaArgs,
    /// Edit this project's overrides in $VISUAL/$EDITOR; they are validated before saving.
    #[arg(long)]
    pub edit: bool,
}

/// Named progress steps: indicatif spinners on a terminal, JSON events with `--json`,
/// nothing otherwise (the log has them at debug level).
pub struct TermProgress {
    json: bool,
    bar: Mutex<Option<indicatif::ProgressBar>>,
    terminal: bool,
}

impl TermProgress {
    pub fn new(json: bool) -> Self {
        TermProgress {
            json,
            bar: Mutex::new(None),
            terminal: std::io::stderr().is_terminal(),
        }
    }
}

impl Progress for TermProgress {
    fn step(&self, step: Step) {
        if self.json {
            let line = serde_json::json!({ "event": "step", "step": step });
            println!("{line}");
            return;
        }
        if !self.terminal {
            tracing::debug!(?step, "lima");
            return;
        }
        let mut bar = self.bar.lock().unwrap_or_else(|e| e.into_inner());
        match step {
            Step::Started { step } => {
                let b = indicatif::ProgressBar::new_spinner();
                b.enable_steady_tick(std::time::Duration::from_millis(120));
                b.set_message(format!("lima: {step}…"));
                *bar = Some(b);
            }
            Step::Done { step, elapsed_ms } => {
                let text = format!("lima: {step} ✓ ({:.1}s)", elapsed_ms as f64 / 1000.0);
                match bar.take() {
                    Some(b) => b.finish_with_message(text),
                    None => eprintln!("{text}"),
                }
            }
            Step::Failed { step, error } => {
                let text = format!("lima: {step} ✗ {error}");
                match bar.take() {
                    Some(b) => b.abandon_with_message(text),
                    None => eprintln!("{text}"),
                }
            }
        }
    }
}

/// The VM's lifecycle events, as the seam's progress steps.
fn sink(progress: &TermProgress) -> impl FnMut(VmEvent) + '_ {
    let mut started = std::time::Instant::now();
    move |e| match e {
        VmEvent::Step { step } => {
            started = std::time::Instant::now();
            progress.step(Step::Started { step });
        }
        VmEvent::Done { step } => progress.step(Step::Done {
            step,
            elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }),
    }
}

/// A Lima or view failure ends the command with 125, the typed error kept as the source.
fn fail(e: impl std::error::Error + Send + Sync + 'static) -> anyhow::Error {
    Failure::setup_caused(e)
}

/// The project of the workdir, its task's view created if needed (`create_view`).
fn project(settings: &LimaSettings, args: &LimaArgs, create_view: bool) -> anyhow::Result<Project> {
    let view = view(settings, args, create_view)?;
    settings.project(&view).map_err(fail)
}

fn view(
    settings: &LimaSettings,
    args: &LimaArgs,
    create_view: bool,
) -> anyhow::Result<sandbox_git::View> {
    let dir = crate::session::workdir(args.workdir.as_deref())?;
    let views = settings.views();
    let view = if create_view {
        views.create_or_reuse(&dir, None).map_err(fail)?.view
    } else {
        let project = views.project_of(&dir).map_err(fail)?;
        match views.list(Some(&project)).map_err(fail)?.into_iter().next() {
            Some(v) => v,
            None => views.create_or_reuse(&dir, None).map_err(fail)?.view,
        }
    };
    Ok(view)
}

pub(crate) fn confirm(question: &str, yes: bool) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        anyhow::bail!("{question} — pass --yes to confirm (no terminal to ask on)");
    }
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

pub fn run(cmd: LimaCommand, ctx: &Context) -> anyhow::Result<i32> {
    let settings = crate::session::lima_settings(ctx);
    match cmd {
        LimaCommand::Config(a) => return config(&settings, a),
        LimaCommand::Status(a) => return status(&settings, &a),
        _ => {}
    }
    let (args, action) = match &cmd {
        LimaCommand::Create(a) => (a, "create"),
        LimaCommand::Start(a) => (a, "start"),
        LimaCommand::Stop(a) => (a, "stop"),
        LimaCommand::Recreate(a) => (a, "recreate"),
        LimaCommand::Delete(a) => (a, "delete"),
        LimaCommand::Console(a) => (a, "console"),
        LimaCommand::Config(_) | LimaCommand::Status(_) => unreachable!("handled above"),
    };
    settings.ensure_home().map_err(fail)?;
    let p = project(
        &settings,
        args,
        matches!(action, "create" | "start" | "recreate"),
    )?;
    p.vm.limactl.check_version().map_err(fail)?;
    let progress = TermProgress::new(args.json);
    let mut sink = sink(&progress);
    let (state, _) = p.vm.state().map_err(fail)?;
    match action {
        "create" => {
            if state != VmState::Absent {
                anyhow::bail!(
                    "the VM {} exists already ({state:?}); `sandbox lima recreate` to make it anew",
                    p.vm.instance
                );
            }
            p.vm.create(&p.yaml, &mut sink).map_err(fail)?;
        }
        "start" => {
            if state == VmState::Absent {
                p.vm.create(&p.yaml, &mut sink).map_err(fail)?;
            }
            if state != VmState::Running {
                if state == VmState::Stopped {
                    apply_or_ask(&p, args.yes, &mut sink)?;
                }
                p.vm.start(&mut sink).map_err(fail)?;
            }
            p.vm.check_provisioned(&p.yaml, &mut sink).map_err(fail)?;
        }
        "stop" => {
            if state == VmState::Running {
                p.vm.stop(&mut sink).map_err(fail)?;
            }
        }
        "recreate" | "delete" => {
            if state != VmState::Absent {
                let q = format!(
                    "{action} the VM {}? Its disk is discarded (the views stay on the host)",
                    p.vm.instance
                );
                if !confirm(&q, args.yes)? {
                    return Ok(1);
                }
                p.vm.delete(&mut sink).map_err(fail)?;
            }
            if action == "recreate" {
                p.vm.create(&p.yaml, &mut sink).map_err(fail)?;
                p.vm.start(&mut sink).map_err(fail)?;
                p.vm.check_provisioned(&p.yaml, &mut sink).map_err(fail)?;
            }
        }
        "console" => {
            if state != VmState::Running {
                anyhow::bail!(
                    "the VM {} is not running; `sandbox lima start` first",
                    p.vm.instance
                );
            }
            let argv = p.vm.limactl.console_argv(&p.vm.instance);
            let status = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .env_clear()
                .envs(p.vm.limactl.env())
                .status()
                .context("running limactl shell")?;
            return Ok(status.code().unwrap_or(1));
        }
        _ => unreachable!(),
    }
    drop(sink);
    report(&p, args.json)
}

/// On a stopped VM: apply what the next start can, ask before a recreate.
fn apply_or_ask(p: &Project, yes: bool, sink: &mut dyn FnMut(VmEvent)) -> anyhow::Result<()> {
    match p.vm.apply_stopped(&p.yaml) {
        Err(sandbox_lima::LimaError::NeedsRecreate { changes, .. }) => {
            let q = format!(
                "these changes need the VM {} recreated: {changes}. Recreate it now?",
                p.vm.instance
            );
            if !confirm(&q, yes)? {
                anyhow::bail!("not recreated; the VM keeps its old configuration (`sandbox lima recreate` when ready)");
            }
            p.vm.delete(sink).map_err(fail)?;
            p.vm.create(&p.yaml, sink).map_err(fail)
        }
        other => other.map_err(fail),
    }
}

fn report(p: &Project, json: bool) -> anyhow::Result<i32> {
    let (state, info) = p.vm.state().map_err(fail)?;
    if json {
        let v = serde_json::json!({
            "event": "result",
            "instance": p.vm.instance,
            "limaHome": p.vm.limactl.home,
            "limactl": p.vm.limactl.path,
            "state": state,
            "info": info,
            "mounts": p.yaml.mounts,
            "views": p.views.iter().map(|v| &v.view_path).collect::<Vec<_>>(),
            "log": p.vm.limactl.ha_log(&p.vm.instance),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let word = match &state {
            VmState::Absent => "not created".to_string(),
            VmState::Stopped => "stopped".to_string(),
            VmState::Running => "running".to_string(),
            VmState::Other { status } => status.clone(),
        };
        println!("VM        {} ({word})", p.vm.instance);
        println!("LIMA_HOME {}", p.vm.limactl.home.display());
        println!("limactl   {}", p.vm.limactl.path.display());
        println!(
            "log       {}",
            p.vm.limactl.ha_log(&p.vm.instance).display()
        );
        println!("mounts:");
        for m in &p.yaml.mounts {
            println!(
                "  {} {}",
                if m.writable { "rw" } else { "ro" },
                m.location.display()
            );
        }
        if let Some(have) = p.vm.current_yaml() {
            for c in sandbox_lima::yaml::changes(&have, &p.yaml) {
                let when = if c.needs_recreate {
                    "needs `sandbox lima recreate`"
                } else {
                    "applies on the next start"
                };
                println!("pending: {} {} → {} ({when})", c.key, c.from, c.to);
            }
        }
    }
    Ok(0)
}

fn status(settings: &LimaSettings, args: &LimaArgs) -> anyhow::Result<i32> {
    let p = project(settings, args, false)?;
    report(&p, args.json)
}

/// Shows or edits the YAML; needs no `limactl`, so a user can see what would run before
/// installing Lima.
fn config(settings: &LimaSettings, a: ConfigArgs) -> anyhow::Result<i32> {
    let view = view(settings, &a.common, false)?;
    let p = settings.plan(&view).map_err(fail)?;
    if !a.edit {
        if a.common.json {
            println!("{}", serde_json::to_string_pretty(&p.yaml)?);
        } else {
            print!("{}", p.yaml.to_yaml());
        }
        return Ok(0);
    }
    let path = &p.overrides_path;
    let current = std::fs::read_to_string(path).unwrap_or_else(|_| {
        "# Overrides for this project's Lima VM (see `sandbox lima config --help`).\n# cpus: 2\n# memory: 4GiB\n# disk: 10GiB\n".into()
    });
    let editor = std::env::var_os("VISUAL")
        .or_else(|| std::env::var_os("EDITOR"))
        .filter(|e| !e.is_empty())
        .ok_or_else(|| anyhow::anyhow!("set VISUAL or EDITOR to edit the overrides"))?;
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let draft = tempfile::Builder::new().suffix(".yaml").tempfile_in(dir)?;
    std::fs::write(draft.path(), &current)?;
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg("exec $0 \"$1\"")
        .arg(&editor)
        .arg(draft.path())
        .status()
        .context("running the editor")?;
    if !status.success() {
        anyhow::bail!("the editor exited with {status}; nothing saved");
    }
    let text = std::fs::read_to_string(draft.path())?;
    // Validated before it lands: a bad file never replaces a good one.
    sandbox_lima::yaml::Overrides::parse(&text)
        .map_err(|e| anyhow::anyhow!("the overrides are not valid, nothing saved: {e}"))?;
    draft
        .persist(path)
        .map_err(|e| anyhow::anyhow!("saving {}: {e}", path.display()))?;
    let p = settings.plan(&view).map_err(fail)?;
    if let Some(have) = settings.current_yaml(&p.instance) {
        for c in sandbox_lima::yaml::changes(&have, &p.yaml) {
            let when = if c.needs_recreate {
                "needs `sandbox lima recreate`"
            } else {
                "applies on the next start"
            };
            eprintln!("sandbox: {} {} → {} ({when})", c.key, c.from, c.to);
        }
    }
    eprintln!("sandbox: saved {}", path.display());
    Ok(0)
}
