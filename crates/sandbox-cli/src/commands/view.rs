//! `sandbox view …`: sandbox views and the fast-forward watcher (docs/views.md). The mechanism
//! lives in `sandbox-git`; this turns arguments into calls and results into text or JSON.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use nix::sys::signal::{SigSet, Signal};
use sandbox_git::{
    CreateOutcome, Created, Mount, Project, SyncState, View, ViewError, ViewManager, ViewStatus,
    WatchEvent,
};
use serde::Serialize;

use crate::context::Context;

/// `sandbox view …` (the about text is the `View` variant's doc comment in cli.rs).
#[derive(Debug, Subcommand)]
pub enum ViewCommand {
    /// Create (or reuse) the sandbox view of a task worktree and print its path.
    #[command(
        long_about = "Create the sandbox view of the task worktree (the current directory, or -C), \
or reuse it if it already exists and is healthy, and print its path.\n\n\
The view is a linked worktree at <views root>/<project>/<task>-sandbox on the branch \
s/<branch>, starting at <branch>'s commit. If s/<branch> already exists it is kept when it is \
at or ahead of <branch>, moved up when it is behind, and creation stops when the two have \
diverged. <project> is the repository's directory name; <task> the task worktree's directory \
name unless --task is given.",
        after_help = "Examples:\n  sandbox view create\n  sandbox view create -C ~/work/app-T-12 --task T-12\n  sandbox view create --json | jq -r .view_path"
    )]
    Create(CreateArgs),

    /// List sandbox views of this project (or of every project with --all).
    #[command(
        after_help = "STATE is where s/<branch> stands relative to <branch>: in_sync, ahead (a \
fast-forward is due), behind (host commits the view lacks), diverged (both moved; run \
`sandbox view status <task>` for the commands that resolve it)."
    )]
    List(ListArgs),

    /// Show one view: ahead/behind/diverged, health, whether a watcher runs, what a VM mounts.
    #[command(
        after_help = "Examples:\n  sandbox view status T-12\n  sandbox view status T-12 --json | jq .sync"
    )]
    Status(StatusArgs),

    /// Remove a view: its directory, its worktree entry and its branch s/<branch>.
    #[command(
        long_about = "Remove a view: its directory, its entry in the repository's worktrees and \
its branch s/<branch>. The task worktree and <branch> are not touched.\n\n\
Refuses while s/<branch> holds commits that <branch> lacks (the agent's unmerged work), unless \
--force; with --force the removed tip is printed so you can still recover it.",
        after_help = "Examples:\n  sandbox view remove T-12\n  sandbox view remove T-12 --force"
    )]
    Remove(RemoveArgs),

    /// Fast-forward <branch> whenever a commit lands on s/<branch>; runs until interrupted.
    #[command(
        long_about = "Watch views (the given tasks, or every view of this project) and \
fast-forward <branch> to s/<branch> whenever a commit lands there, updating the task worktree \
that has <branch> checked out the way `git merge --ff-only` would. Event-driven (inotify), \
not polling.\n\n\
It never forces and never overwrites: if the task worktree has uncommitted changes in the \
files the update touches, the branch is left alone and the watcher reports it (and retries \
once the worktree is clean); if <branch> has commits of its own, the divergence is reported \
with the commands that resolve it. One watcher per view; `sandbox view status` shows whether \
one is running. Stops on Ctrl-C (SIGINT), SIGTERM or SIGHUP, after finishing the update in \
progress, or when every watched view has been removed.",
        after_help = "Output: one line per event on stderr; with --json, one JSON object per \
event on stdout (\"event\": watching, fast_forwarded, diverged, blocked, resolved, view_gone, \
error, stopped), and problems still also on stderr.\n\nExamples:\n  sandbox view watch\n  \
sandbox view watch T-12 T-13 --json"
    )]
    Watch(WatchArgs),
}

#[derive(Debug, Clone, Args)]
pub struct Where {
    /// A directory of the project: the task worktree for `create`, any worktree otherwise.
    /// Default: the current directory.
    #[arg(short = 'C', long = "workdir", value_name = "DIR")]
    pub workdir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub at: Where,
    /// The task name (default: the task worktree's directory name). One name, valid in a git
    /// ref: letters, digits, `-`, `_`, `.`.
    #[arg(long, value_name = "NAME")]
    pub task: Option<String>,
    /// Print the view (and the mounts a VM backend makes of it) as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub at: Where,
    /// List the views of every project under the views root.
    #[arg(long)]
    pub all: bool,
    /// Print a JSON array of view statuses.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub at: Where,
    /// The task whose view to show.
    #[arg(value_name = "TASK")]
    pub task: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    #[command(flatten)]
    pub at: Where,
    /// The task whose view to remove.
    #[arg(value_name = "TASK")]
    pub task: String,
    /// Remove even if s/<branch> holds commits that <branch> lacks (they are dropped).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub at: Where,
    /// The tasks whose views to watch (default: every view of this project).
    #[arg(value_name = "TASK")]
    pub tasks: Vec<String>,
    /// Print events as JSON lines on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: ViewCommand, ctx: &Context) -> anyhow::Result<i32> {
    let views = manager(ctx)?;
    match cmd {
        ViewCommand::Create(a) => create(&views, a),
        ViewCommand::List(a) => list(&views, a),
        ViewCommand::Status(a) => status(&views, a),
        ViewCommand::Remove(a) => remove(&views, a),
        ViewCommand::Watch(a) => watch(&views, a),
    }
}

/// The views root: `views.root`, else `$XDG_DATA_HOME/sandbox/views` (a relative
/// `views.root` is refused by [`manager`]).
pub fn views_root(ctx: &Context) -> std::path::PathBuf {
    crate::paths::views_root_in(&ctx.dirs, ctx.config())
}

fn manager(ctx: &Context) -> anyhow::Result<ViewManager> {
    let root = views_root(ctx);
    if !root.is_absolute() {
        anyhow::bail!(
            "config key views.root: {} is not an absolute path; set it to an absolute path or one starting with ~/",
            root.display()
        );
    }
    Ok(ViewManager::new(root).with_runtime_dir(&ctx.dirs.runtime))
}

fn dir(at: &Where) -> anyhow::Result<PathBuf> {
    match &at.workdir {
        Some(d) => Ok(d.clone()),
        None => std::env::current_dir().context("the current directory is unusable"),
    }
}

fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

fn mode(m: &Mount) -> &'static str {
    if m.writable {
        "rw"
    } else {
        "ro"
    }
}

fn purpose(m: &Mount) -> String {
    serde_json::to_value(m.purpose)
        .ok()
        .and_then(|v| v.as_str().map(|s| s.replace('_', " ")))
        .unwrap_or_default()
}

/// A POSIX-shell-safe rendering of a path for suggested commands.
fn sh(p: &Path) -> String {
    let s = p.to_string_lossy();
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@%+=,".contains(&b))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// One sentence on where the view stands, with what to do about it.
fn explain(view: &View, sync: &SyncState, watcher_running: Option<bool>) -> String {
    let (b, c) = (&view.branch, &view.child_branch);
    match sync {
        SyncState::InSync => format!("in sync: {c} and {b} are at the same commit"),
        SyncState::Ahead { ahead } => {
            let who = match watcher_running {
                Some(false) => format!(
                    " (no watcher is running: sandbox view watch {})",
                    view.task
                ),
                _ => String::new(),
            };
            format!("ahead: {c} has {ahead} commit(s) {b} lacks; a fast-forward is due{who}")
        }
        SyncState::Behind { behind } => format!(
            "behind: {b} has {behind} commit(s) the view lacks; inside the view, `git merge --ff-only {b}` brings them in"
        ),
        SyncState::Diverged { ahead, behind, .. } => format!(
            "diverged: {c} has {ahead} commit(s) {b} lacks and {b} has {behind} {c} lacks; nothing is moved until you resolve it with `git -C {wt} merge {c}` (or `git -C {wt} rebase {c}`)",
            wt = sh(&view.task_worktree)
        ),
        SyncState::Missing { what } => format!("branch {what} does not exist"),
    }
}

fn create(views: &ViewManager, a: CreateArgs) -> anyhow::Result<i32> {
    let dir = dir(&a.at)?;
    let created = views.create_or_reuse(&dir, a.task.as_deref())?;
    if a.json {
        #[derive(Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            created: &'a Created,
            mounts: Vec<Mount>,
        }
        print_json(&Out {
            mounts: created.view.vm_mounts(),
            created: &created,
        })?;
    } else {
        let v = &created.view;
        let what = match created.outcome {
            CreateOutcome::Created => "created",
            CreateOutcome::Reused => "reusing",
            CreateOutcome::Recreated => "recreated (its directory was gone; the branch was kept)",
        };
        eprintln!(
            "sandbox: {what} view {} of {} on {}",
            v.task,
            v.task_worktree.display(),
            v.child_branch
        );
        if !matches!(created.sync, SyncState::InSync) {
            eprintln!(
                "sandbox: view {}: {}",
                v.task,
                explain(v, &created.sync, None)
            );
        }
        println!("{}", v.view_path.display());
    }
    Ok(0)
}

fn list(views: &ViewManager, a: ListArgs) -> anyhow::Result<i32> {
    let project: Option<Project> = if a.all {
        None
    } else {
        match views.project_of(&dir(&a.at)?) {
            Ok(p) => Some(p),
            // Outside any repository and no -C: show everything rather than nothing.
            Err(ViewError::NotARepository { .. }) if a.at.workdir.is_none() => None,
            Err(e) => return Err(e.into()),
        }
    };
    let found = views.list(project.as_ref())?;
    // A view whose repository cannot be read is listed with the error, not dropped.
    let statuses: Vec<(View, Result<ViewStatus, String>)> = found
        .into_iter()
        .map(|v| {
            let st = views.status(&v).map_err(|e| e.to_string());
            (v, st)
        })
        .collect();
    if a.json {
        let items = statuses
            .iter()
            .map(|(v, s)| -> anyhow::Result<serde_json::Value> {
                Ok(match s {
                    Ok(st) => serde_json::to_value(st)?,
                    Err(e) => {
                        let mut o = serde_json::to_value(v)?;
                        o["error"] = serde_json::Value::String(e.clone());
                        o
                    }
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        print_json(&items)?;
        return Ok(0);
    }
    if statuses.is_empty() {
        match &project {
            Some(p) => eprintln!(
                "sandbox: no sandbox views for project {} under {} (create one with `sandbox view create`; --all lists every project)",
                p.name,
                views.views_root().display()
            ),
            None => eprintln!(
                "sandbox: no sandbox views under {}",
                views.views_root().display()
            ),
        }
        return Ok(0);
    }
    let mut rows = vec![[
        "PROJECT".to_string(),
        "TASK".into(),
        "BRANCH".into(),
        "STATE".into(),
        "WATCHER".into(),
        "VIEW".into(),
    ]];
    for (v, s) in &statuses {
        rows.push(match s {
            Ok(st) => {
                let state = match &st.sync {
                    SyncState::Ahead { ahead } => format!("ahead {ahead}"),
                    SyncState::Behind { behind } => format!("behind {behind}"),
                    SyncState::Diverged { ahead, behind, .. } => {
                        format!("diverged +{ahead}/-{behind}")
                    }
                    other => other.label().replace('_', " "),
                };
                let state = if st.problems.is_empty() {
                    state
                } else {
                    format!("{state} (unhealthy)")
                };
                [
                    st.view.project.clone(),
                    st.view.task.clone(),
                    st.view.branch.clone(),
                    state,
                    if st.watcher.running { "running" } else { "-" }.into(),
                    st.view.view_path.display().to_string(),
                ]
            }
            Err(e) => [
                v.project.clone(),
                v.task.clone(),
                v.branch.clone(),
                format!("error: {e}"),
                "-".into(),
                v.view_path.display().to_string(),
            ],
        });
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = std::io::stdout().lock();
    for r in rows {
        for (i, cell) in r.iter().enumerate().take(5) {
            write!(out, "{cell:<w$}  ", w = widths[i])?;
        }
        writeln!(out, "{}", r[5])?;
    }
    Ok(0)
}

fn status(views: &ViewManager, a: StatusArgs) -> anyhow::Result<i32> {
    let project = views.project_of(&dir(&a.at)?)?;
    let view = views.find(&project, &a.task)?;
    let st = views.status(&view)?;
    if a.json {
        print_json(&st)?;
        return Ok(0);
    }
    let v = &st.view;
    let short = |c: &Option<String>| {
        c.as_deref()
            .map(|s| s.chars().take(12).collect::<String>())
            .unwrap_or_else(|| "missing".into())
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "view      {} (project {})", v.task, v.project)?;
    writeln!(out, "path      {}", v.view_path.display())?;
    writeln!(
        out,
        "task      {} on {}",
        v.task_worktree.display(),
        v.branch
    )?;
    writeln!(
        out,
        "branches  {} {} → {} {}",
        v.child_branch,
        short(&st.child_commit),
        v.branch,
        short(&st.branch_commit)
    )?;
    writeln!(
        out,
        "state     {}",
        explain(v, &st.sync, Some(st.watcher.running))
    )?;
    match (st.watcher.running, st.watcher.pid) {
        (true, Some(pid)) => writeln!(out, "watcher   running (pid {pid})")?,
        (true, None) => writeln!(out, "watcher   running")?,
        (false, _) => writeln!(
            out,
            "watcher   not running (start one: sandbox view watch {})",
            v.task
        )?,
    }
    if let Some(r) = &st.watcher.last_report {
        writeln!(out, "reported  {}", r.describe())?;
    }
    if st.problems.is_empty() {
        writeln!(out, "health    ok")?;
    } else {
        for p in &st.problems {
            writeln!(out, "problem   {p}")?;
        }
        writeln!(
            out,
            "          (remove it with `sandbox view remove {}` and create it again)",
            v.task
        )?;
    }
    writeln!(
        out,
        "mounts    (what a VM backend exposes; guest path = host path)"
    )?;
    for m in &st.mounts {
        writeln!(
            out,
            "  {}  {}  ({})",
            mode(m),
            m.host_path.display(),
            purpose(m)
        )?;
    }
    Ok(0)
}

fn remove(views: &ViewManager, a: RemoveArgs) -> anyhow::Result<i32> {
    let project = views.project_of(&dir(&a.at)?)?;
    let view = views.find(&project, &a.task)?;
    let removed = views.remove(&view, a.force)?;
    eprintln!(
        "sandbox: removed view {} ({}) and branch {}",
        view.task,
        view.view_path.display(),
        view.child_branch
    );
    if removed.dropped_commits > 0 {
        if let Some(tip) = &removed.child_tip {
            eprintln!(
                "sandbox: dropped {} commit(s) of {}; until git prunes them you can get them back with: git -C {} branch {} {}",
                removed.dropped_commits,
                view.child_branch,
                sh(&view.task_worktree),
                view.child_branch,
                tip
            );
        }
    }
    Ok(0)
}

enum Msg {
    Event(Box<WatchEvent>),
    Signal(Signal),
}

#[derive(Serialize)]
struct Line<'a> {
    time_unix_ms: u64,
    #[serde(flatten)]
    event: &'a WatchEvent,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn watch(views: &ViewManager, a: WatchArgs) -> anyhow::Result<i32> {
    let project = views.project_of(&dir(&a.at)?)?;
    let list: Vec<View> = if a.tasks.is_empty() {
        views.list(Some(&project))?
    } else {
        a.tasks
            .iter()
            .map(|t| views.find(&project, t))
            .collect::<Result<_, _>>()?
    };
    if list.is_empty() {
        anyhow::bail!(
            "no sandbox views for project {} under {}; create one with `sandbox view create -C <task worktree>`",
            project.name,
            views.views_root().display()
        );
    }

    // Take the termination signals in one thread (the mask is inherited by the watcher's
    // threads), so stopping finishes the update in progress instead of leaving git's
    // index.lock behind in the task worktree.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    signals
        .thread_block()
        .context("cannot block termination signals")?;
    let (tx, rx) = mpsc::channel();
    let sig_tx = tx.clone();
    std::thread::spawn(move || {
        if let Ok(sig) = signals.wait() {
            let _ = sig_tx.send(Msg::Signal(sig));
        }
    });

    let mut remaining: BTreeSet<String> = list.iter().map(|v| v.task.clone()).collect();
    let handle = views.watch(list, move |e| {
        let _ = tx.send(Msg::Event(Box::new(e)));
    })?;
    let json = a.json;
    let emit = |e: &WatchEvent| -> bool {
        if e.is_problem() || !json {
            eprintln!("sandbox: {}", e.describe());
        }
        if json {
            let mut out = std::io::stdout().lock();
            let line = Line {
                time_unix_ms: now_ms(),
                event: e,
            };
            // A closed stdout (the reader went away) ends the watch.
            return serde_json::to_writer(&mut out, &line).is_ok()
                && writeln!(out).is_ok()
                && out.flush().is_ok();
        }
        true
    };
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Event(e) => {
                if !emit(&e) {
                    break;
                }
                if let WatchEvent::ViewGone { task, .. } = &*e {
                    remaining.remove(task);
                    if remaining.is_empty() {
                        eprintln!("sandbox: every watched view is gone; stopping");
                        break;
                    }
                }
            }
            Msg::Signal(sig) => {
                tracing::debug!("{sig}: stopping the watcher");
                break;
            }
        }
    }
    handle.stop();
    // The watcher's last words (`stopped`) arrive after it has finished.
    while let Ok(Msg::Event(e)) = rx.try_recv() {
        emit(&e);
    }
    Ok(0)
}
