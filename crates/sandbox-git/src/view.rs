//! Creating, finding, checking and removing sandbox views.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use git2::{BranchType, Oid, Repository, WorktreeAddOptions};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::error::ViewError;
use crate::events::WatchEvent;
use crate::lock;
use crate::meta;
use crate::mounts::{self, Mount};
use crate::names;
use crate::repo::{self, Project};
use crate::status::{self, SyncState, ViewStatus, WatcherState};
use crate::util::{canon, q, read_pointer, short};
use crate::watcher::{WatchOptions, Watcher, WatcherHandle};

/// A sandbox view: a linked worktree of tracked files on `s/<branch>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// The repository's name (`<project>` in the view path).
    pub project: String,
    /// The task name (`<task>` in the view path).
    pub task: String,
    /// The task's branch `<b>`, which the watcher fast-forwards.
    pub branch: String,
    /// `s/<b>`, checked out in the view.
    pub child_branch: String,
    /// `<views root>/<project>/<task>-sandbox`: what a VM mounts as the agent's directory.
    pub view_path: PathBuf,
    /// The task worktree the view was made from.
    pub task_worktree: PathBuf,
    /// The repository's common git directory.
    pub common_dir: PathBuf,
    /// The view's name in `<common>/worktrees/` (`<task>-sandbox`).
    pub worktree_name: String,
}

impl View {
    /// The paths a VM backend mounts for this view, with their mode. See [`mounts`].
    pub fn vm_mounts(&self) -> Vec<Mount> {
        mounts::for_view(self)
    }

    /// `<views root>/<project>/<task>-sandbox.git-layer`: the writable layer of the git store
    /// the VM stacks over the read-only common dir (`upper/`, `work/`). See [`mounts`].
    pub fn store_layer_dir(&self) -> PathBuf {
        let mut name = self.view_path.as_os_str().to_os_string();
        name.push(".git-layer");
        PathBuf::from(name)
    }

    /// `<common>/worktrees/<view>`: the view's HEAD, index and reflog.
    pub fn admin_dir(&self) -> PathBuf {
        self.common_dir.join("worktrees").join(&self.worktree_name)
    }

    pub fn branch_ref(&self) -> String {
        format!("refs/heads/{}", self.branch)
    }

    pub fn child_ref(&self) -> String {
        format!("refs/heads/{}", self.child_branch)
    }

    /// The views root this view lives in.
    pub(crate) fn views_root(&self) -> PathBuf {
        self.view_path
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// What is wrong with the view on disk (empty when healthy). Only reads.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let admin = self.admin_dir();
        let dotgit = self.view_path.join(".git");
        if !self.view_path.is_dir() {
            out.push(format!(
                "its directory {} is missing",
                self.view_path.display()
            ));
        } else {
            match read_pointer(&dotgit, "gitdir: ", &self.view_path) {
                Some(p) if canon(&p) == canon(&admin) => {}
                _ => out.push(format!(
                    "{} does not point to {} (was it rewritten from inside the sandbox?)",
                    dotgit.display(),
                    admin.display()
                )),
            }
        }
        if !admin.is_dir() {
            out.push(format!(
                "its worktree registration {} is missing",
                admin.display()
            ));
        } else {
            match read_pointer(&admin.join("gitdir"), "", &admin) {
                Some(p) if canon(&p) == canon(&dotgit) => {}
                _ => out.push(format!(
                    "{} does not point to {}",
                    admin.join("gitdir").display(),
                    dotgit.display()
                )),
            }
            let head = std::fs::read_to_string(admin.join("HEAD")).unwrap_or_default();
            if head.trim_end().strip_prefix("ref: ") != Some(self.child_ref().as_str()) {
                out.push(format!(
                    "its HEAD is not on {} (switch back inside the view: git switch {})",
                    self.child_branch, self.child_branch
                ));
            }
        }
        if let Ok(repo) = repo::open_common(&self.common_dir) {
            if repo.refname_to_id(&self.child_ref()).is_err() {
                out.push(format!("branch {} is missing", self.child_branch));
            }
        } else {
            out.push(format!(
                "its repository {} cannot be opened",
                self.common_dir.display()
            ));
        }
        out
    }
}

/// What `create_or_reuse` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreateOutcome {
    /// A new view was made.
    Created,
    /// A healthy view existed and is returned as is.
    Reused,
    /// The view was recorded but its directory was gone: it was checked out again on the
    /// existing `s/<b>`, whose commits are kept.
    Recreated,
}

/// The result of `create_or_reuse`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Created {
    #[serde(flatten)]
    pub view: View,
    pub outcome: CreateOutcome,
    /// Where `s/<b>` stands relative to `<b>` now.
    pub sync: SyncState,
}

/// The result of `remove`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Removed {
    #[serde(flatten)]
    pub view: View,
    /// Commits on `s/<b>` that were not on `<b>` and were dropped (only with `force`).
    pub dropped_commits: usize,
    /// Where `s/<b>` pointed when it was deleted (recover with `git branch s/<b> <id>`).
    pub child_tip: Option<String>,
}

/// Creates, finds and removes the views under one views root.
#[derive(Debug, Clone)]
pub struct ViewManager {
    root: PathBuf,
    runtime_dir: PathBuf,
}

/// `$XDG_RUNTIME_DIR/sandbox`, else `<tmp>/sandbox-<uid>`: the same rule as the CLI's.
pub(crate) fn default_runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(v) if Path::new(&v).is_absolute() => PathBuf::from(v).join("sandbox"),
        _ => std::env::temp_dir().join(format!("sandbox-{}", nix::unistd::getuid())),
    }
}

/// Serialises create/remove within one project (`<root>/<project>/.lock`), so two
/// concurrent `create`s cannot both decide to make the same view.
struct ProjectLock {
    _held: Flock<File>,
}

impl ProjectLock {
    fn take(dir: &Path) -> Result<Self, ViewError> {
        std::fs::create_dir_all(dir).map_err(ViewError::io("cannot create", dir))?;
        let path = dir.join(".lock");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(ViewError::io("cannot open", &path))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map(|held| ProjectLock { _held: held })
            .map_err(|(_, e)| ViewError::io("cannot lock", &path)(e.into()))
    }
}

impl ViewManager {
    /// Views live under `views_root` (`<views_root>/<project>/<task>-sandbox`).
    pub fn new(views_root: impl Into<PathBuf>) -> Self {
        ViewManager {
            root: views_root.into(),
            runtime_dir: default_runtime_dir(),
        }
    }

    /// Where watchers keep their liveness locks (`<runtime>/views/…`). Pass the same directory
    /// as the CLI (`$XDG_RUNTIME_DIR/sandbox`) so `sandbox view status` sees your watchers.
    pub fn with_runtime_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.runtime_dir = dir.into();
        self
    }

    pub fn views_root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn lock_dir(&self) -> PathBuf {
        self.runtime_dir.join("views")
    }

    /// The canonical views root; `None` if it does not exist.
    fn root(&self) -> Result<Option<PathBuf>, ViewError> {
        match std::fs::canonicalize(&self.root) {
            Ok(p) => Ok(Some(p)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ViewError::io("cannot resolve the views root", &self.root)(
                e,
            )),
        }
    }

    /// The views root, created if missing, canonical.
    fn created_root(&self) -> Result<PathBuf, ViewError> {
        std::fs::create_dir_all(&self.root)
            .map_err(ViewError::io("cannot create the views root", &self.root))?;
        std::fs::canonicalize(&self.root)
            .map_err(ViewError::io("cannot resolve the views root", &self.root))
    }

    /// The project that `dir` (any directory of any worktree) belongs to.
    pub fn project_of(&self, dir: &Path) -> Result<Project, ViewError> {
        repo::project_of(&repo::discover(dir)?)
    }

    /// Creates the view of the task worktree containing `task_worktree`, or returns the
    /// existing one if it is healthy. `task` defaults to the worktree directory's name.
    pub fn create_or_reuse(
        &self,
        task_worktree: &Path,
        task: Option<&str>,
    ) -> Result<Created, ViewError> {
        let root = self.created_root()?;
        let repo = repo::discover(task_worktree)?;
        let project = repo::project_of(&repo)?;
        let checkout = repo::task_checkout(&repo)?;
        if checkout.worktree.starts_with(&root) {
            return Err(ViewError::IsAView {
                path: checkout.worktree,
                root,
            });
        }
        let task = match task {
            Some(t) => t.to_string(),
            None => checkout
                .worktree
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        names::validate_task(&task)?;
        let view_path = names::view_path(&root, &project.name, &task)?;
        let project_dir = root.join(&project.name);
        let _lock = ProjectLock::take(&project_dir)?;
        // A symlinked project directory could lead out of the root.
        if canon(&project_dir).parent() != Some(root.as_path()) {
            return Err(ViewError::OutsideViewsRoot {
                path: view_path,
                root,
            });
        }
        let view = View {
            project: project.name.clone(),
            task: task.clone(),
            child_branch: names::child_branch(&checkout.branch)?,
            branch: checkout.branch.clone(),
            view_path,
            task_worktree: checkout.worktree.clone(),
            common_dir: project.common_dir.clone(),
            worktree_name: names::worktree_name(&task),
        };
        let common = repo::open_common(&project.common_dir)?;

        let outcome = match meta::read(&root, &project.name, &task)? {
            Some(recorded) => {
                if recorded.common_dir != project.common_dir {
                    return Err(ViewError::NameTaken {
                        view_path: recorded.view_path,
                        other: recorded.common_dir,
                        this: project.common_dir,
                    });
                }
                if recorded.branch != checkout.branch {
                    return Err(ViewError::BranchMismatch {
                        task,
                        recorded: recorded.branch,
                        current: checkout.branch,
                        worktree: checkout.worktree,
                    });
                }
                let problems = view.problems();
                if problems.is_empty() {
                    if recorded.task_worktree != view.task_worktree {
                        // The task worktree was moved (git worktree move): follow it.
                        meta::write(&root, &view)?;
                    }
                    CreateOutcome::Reused
                } else if !view.view_path.exists() {
                    self.clear_stale_admin(&view)?;
                    prepare_child(&common, &view, checkout.head)?;
                    add_worktree(&common, &view)?;
                    meta::write(&root, &view)?;
                    CreateOutcome::Recreated
                } else {
                    return Err(ViewError::Unhealthy {
                        task,
                        view_path: view.view_path,
                        problems: problems.join("; "),
                    });
                }
            }
            None => {
                if view.view_path.symlink_metadata().is_ok() {
                    return Err(ViewError::PathOccupied {
                        path: view.view_path,
                    });
                }
                self.clear_stale_admin(&view)?;
                prepare_child(&common, &view, checkout.head)?;
                add_worktree(&common, &view)?;
                meta::write(&root, &view)?;
                CreateOutcome::Created
            }
        };
        ensure_mount_sources(&view.common_dir)?;
        ensure_store_layer(&view)?;
        let sync = self.sync_of(&common, &view)?;
        Ok(Created {
            view,
            outcome,
            sync,
        })
    }

    /// A `worktrees/<name>` entry left behind by a view whose directory is gone is removed;
    /// anything else by that name is someone else's and stops us.
    fn clear_stale_admin(&self, view: &View) -> Result<(), ViewError> {
        let admin = view.admin_dir();
        if admin.symlink_metadata().is_err() {
            return Ok(());
        }
        let points_to_view = read_pointer(&admin.join("gitdir"), "", &admin)
            .is_some_and(|p| p == view.view_path.join(".git"));
        if points_to_view && !view.view_path.exists() {
            std::fs::remove_dir_all(&admin).map_err(ViewError::io(
                "cannot remove the stale worktree entry",
                &admin,
            ))?;
            Ok(())
        } else {
            Err(ViewError::PathOccupied { path: admin })
        }
    }

    fn sync_of(&self, common: &Repository, view: &View) -> Result<SyncState, ViewError> {
        let b = common.refname_to_id(&view.branch_ref()).ok();
        let c = common.refname_to_id(&view.child_ref()).ok();
        match (b, c) {
            (Some(b), Some(c)) => status::relation(common, b, c),
            (None, _) => Ok(SyncState::Missing {
                what: view.branch.clone(),
            }),
            (_, None) => Ok(SyncState::Missing {
                what: view.child_branch.clone(),
            }),
        }
    }

    /// All views, or those of `project`.
    pub fn list(&self, project: Option<&Project>) -> Result<Vec<View>, ViewError> {
        let Some(root) = self.root()? else {
            return Ok(Vec::new());
        };
        let projects = match project {
            Some(p) => vec![p.name.clone()],
            None => meta::projects(&root)?,
        };
        let mut out = Vec::new();
        for name in projects {
            for task in meta::tasks(&root, &name)? {
                match meta::read(&root, &name, &task) {
                    Ok(Some(v)) => {
                        if project.is_none_or(|p| p.common_dir == v.common_dir) {
                            out.push(v)
                        }
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!("skipping a view record: {e}"),
                }
            }
        }
        Ok(out)
    }

    /// The view of `task` in `project`.
    pub fn find(&self, project: &Project, task: &str) -> Result<View, ViewError> {
        names::validate_task(task)?;
        let not_found = || ViewError::NotFound {
            task: task.to_string(),
            project: project.name.clone(),
            root: self.root.clone(),
        };
        let Some(root) = self.root()? else {
            return Err(not_found());
        };
        match meta::read(&root, &project.name, task)? {
            None => Err(not_found()),
            Some(v) if v.common_dir != project.common_dir => Err(ViewError::NameTaken {
                view_path: v.view_path,
                other: v.common_dir,
                this: project.common_dir.clone(),
            }),
            Some(v) => Ok(v),
        }
    }

    /// Where `view` stands.
    pub fn status(&self, view: &View) -> Result<ViewStatus, ViewError> {
        let common = repo::open_common(&view.common_dir)?;
        let b = common.refname_to_id(&view.branch_ref()).ok();
        let c = common.refname_to_id(&view.child_ref()).ok();
        let sync = self.sync_of(&common, view)?;
        Ok(ViewStatus {
            view: view.clone(),
            branch_commit: b.map(|o| o.to_string()),
            child_commit: c.map(|o| o.to_string()),
            sync,
            problems: view.problems(),
            watcher: self.watcher_state(view),
            mounts: view.vm_mounts(),
        })
    }

    /// Whether a watcher (in any process) is following `view`.
    pub fn watcher_state(&self, view: &View) -> WatcherState {
        let dir = self.lock_dir();
        match lock::probe(&lock::lock_path(&dir, &view.project, &view.task)) {
            Some(pid) => {
                let last_report = std::fs::read(lock::report_path(&dir, &view.project, &view.task))
                    .ok()
                    .and_then(|t| serde_json::from_slice::<WatchEvent>(&t).ok());
                WatcherState {
                    running: true,
                    pid,
                    last_report,
                }
            }
            None => WatcherState {
                running: false,
                pid: None,
                last_report: None,
            },
        }
    }

    /// Removes the view's directory, its worktree entry, `s/<b>` and its record. Refuses
    /// while `s/<b>` holds commits that `<b>` lacks, unless `force`.
    pub fn remove(&self, view: &View, force: bool) -> Result<Removed, ViewError> {
        let root = self.root()?.unwrap_or_else(|| self.root.clone());
        // The record was validated on read; check the path once more before deleting.
        let expected = names::view_path(&root, &view.project, &view.task)?;
        if view.view_path != expected {
            return Err(ViewError::OutsideViewsRoot {
                path: view.view_path.clone(),
                root,
            });
        }
        let _lock = ProjectLock::take(&root.join(&view.project))?;
        let common = repo::open_common(&view.common_dir).ok();
        let mut child_tip: Option<Oid> = None;
        let mut unmerged = 0;
        if let Some(common) = &common {
            if let Ok(c) = common.refname_to_id(&view.child_ref()) {
                child_tip = Some(c);
                unmerged = match common.refname_to_id(&view.branch_ref()) {
                    Ok(b) => {
                        common
                            .graph_ahead_behind(c, b)
                            .map_err(ViewError::git("cannot compare branches"))?
                            .0
                    }
                    Err(_) => count_commits(common, c),
                };
                if unmerged > 0 && !force {
                    return Err(ViewError::Unmerged {
                        child: view.child_branch.clone(),
                        branch: view.branch.clone(),
                        count: unmerged,
                        tip: short(&c),
                        worktree: view.task_worktree.clone(),
                    });
                }
            }
        }
        if view.view_path.symlink_metadata().is_ok() {
            std::fs::remove_dir_all(&view.view_path).map_err(ViewError::io(
                "cannot remove the view directory",
                &view.view_path,
            ))?;
        }
        let admin = view.admin_dir();
        if admin.symlink_metadata().is_ok() {
            std::fs::remove_dir_all(&admin)
                .map_err(ViewError::io("cannot remove the worktree entry", &admin))?;
        }
        let layer = view.store_layer_dir();
        if layer.symlink_metadata().is_ok() {
            use std::os::unix::fs::PermissionsExt;
            // overlayfs leaves its work/work without permissions.
            let _ = std::fs::set_permissions(
                layer.join("work/work"),
                std::fs::Permissions::from_mode(0o700),
            );
            std::fs::remove_dir_all(&layer)
                .map_err(ViewError::io("cannot remove the git store layer", &layer))?;
        }
        if let (Some(common), Some(tip)) = (&common, child_tip) {
            match common.find_branch(&view.child_branch, BranchType::Local) {
                Ok(mut branch) => {
                    // libgit2 deletes only if the ref still holds the value it just read,
                    // so a commit landing meanwhile keeps the branch.
                    let moved = branch.get().target() != Some(tip);
                    if moved {
                        return Err(ViewError::Git {
                            action: format!("deleting {}", view.child_branch),
                            message: format!(
                                "it moved while the view was being removed; it was kept. Delete it yourself if you mean to: git -C {} branch -D {}",
                                q(&view.task_worktree),
                                view.child_branch
                            ),
                        });
                    }
                    branch.delete().map_err(ViewError::git(format!(
                        "cannot delete branch {}",
                        view.child_branch
                    )))?;
                }
                Err(e) if e.code() == git2::ErrorCode::NotFound => {}
                Err(e) => {
                    return Err(ViewError::git(format!("cannot find {}", view.child_branch))(e))
                }
            }
        }
        meta::remove(&root, &view.project, &view.task)?;
        Ok(Removed {
            view: view.clone(),
            dropped_commits: if force { unmerged } else { 0 },
            child_tip: child_tip.map(|o| o.to_string()),
        })
    }

    /// Starts a watcher for `views` that reports to `sink`; see [`Watcher`].
    pub fn watch(
        &self,
        views: Vec<View>,
        sink: impl FnMut(WatchEvent) + Send + 'static,
    ) -> Result<WatcherHandle, ViewError> {
        let options = WatchOptions {
            lock_dir: self.lock_dir(),
            ..WatchOptions::default()
        };
        Watcher::start_with(views, options, sink)
    }
}

/// Commits reachable from `tip` (capped; only used when `<b>` itself is gone).
fn count_commits(repo: &Repository, tip: Oid) -> usize {
    let Ok(mut walk) = repo.revwalk() else {
        return 1;
    };
    if walk.push(tip).is_err() {
        return 1;
    }
    walk.take(100_000).count().max(1)
}

/// Makes `s/<b>` ready for a new view: created at `<b>`, kept if it is at or ahead of `<b>`,
/// moved up to `<b>` if it is behind, refused if the two have diverged.
fn prepare_child(common: &Repository, view: &View, head: Oid) -> Result<(), ViewError> {
    let child_ref = view.child_ref();
    match common.refname_to_id(&child_ref) {
        Ok(existing) => match status::relation(common, head, existing)? {
            SyncState::InSync | SyncState::Ahead { .. } => Ok(()),
            SyncState::Behind { .. } => {
                // Start the view at <b>, as a new one would; compare-and-swap so a writer
                // racing us is never overwritten.
                common
                    .reference_matching(
                        &child_ref,
                        head,
                        true,
                        existing,
                        &format!("sandbox: view starts at {}", view.branch),
                    )
                    .map_err(ViewError::git(format!(
                        "cannot move {} up to {}",
                        view.child_branch, view.branch
                    )))?;
                Ok(())
            }
            SyncState::Diverged { .. } | SyncState::Missing { .. } => {
                Err(ViewError::ChildBranchUnrelated {
                    branch: view.branch.clone(),
                    child: view.child_branch.clone(),
                    branch_commit: short(&head),
                    child_commit: short(&existing),
                })
            }
        },
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            let commit = common
                .find_commit(head)
                .map_err(ViewError::git(format!("cannot read commit {head}")))?;
            common
                .branch(&view.child_branch, &commit, false)
                .map_err(ViewError::git(format!(
                    "cannot create branch {}",
                    view.child_branch
                )))?;
            Ok(())
        }
        Err(e) => Err(ViewError::git(format!("cannot read {child_ref}"))(e)),
    }
}

/// `git worktree add <view> s/<b>`, through libgit2: a plain checkout of tracked files.
fn add_worktree(common: &Repository, view: &View) -> Result<(), ViewError> {
    if let Some(parent) = view.view_path.parent() {
        std::fs::create_dir_all(parent).map_err(ViewError::io("cannot create", parent))?;
    }
    let reference = common
        .find_reference(&view.child_ref())
        .map_err(ViewError::git(format!("cannot find {}", view.child_branch)))?;
    let mut opts = WorktreeAddOptions::new();
    opts.reference(Some(&reference));
    if let Err(e) = common.worktree(&view.worktree_name, &view.view_path, Some(&opts)) {
        // Leave nothing half-made: both paths were checked to be absent before.
        let _ = std::fs::remove_dir_all(&view.view_path);
        let _ = std::fs::remove_dir_all(view.admin_dir());
        let hint = if e.message().contains("already checked out") {
            format!(
                " ({} is checked out in another worktree; switch that one to another branch)",
                view.child_branch
            )
        } else {
            String::new()
        };
        return Err(ViewError::Git {
            action: format!(
                "cannot add the worktree {} on {}",
                view.view_path.display(),
                view.child_branch
            ),
            message: format!("{}{hint}", e.message()),
        });
    }
    Ok(())
}

/// VM backends mount `logs/` and `hooks/`; git creates them lazily, a mount needs them now.
/// The view's git store layer, private to the user (what lands there is the VM's until the
/// host applies it).
fn ensure_store_layer(view: &View) -> Result<(), ViewError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = view.store_layer_dir();
    for sub in ["upper", "work"] {
        let p = dir.join(sub);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&p)
            .map_err(ViewError::io("cannot create", &p))?;
    }
    Ok(())
}

fn ensure_mount_sources(common_dir: &Path) -> Result<(), ViewError> {
    for d in ["logs", "hooks", "refs"] {
        let p = common_dir.join(d);
        if !p.exists() {
            std::fs::create_dir_all(&p).map_err(ViewError::io("cannot create", &p))?;
        }
    }
    Ok(())
}
