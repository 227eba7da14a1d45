//! Creating, finding, checking and removing sandbox views: the [`ViewManager`] of one views
//! root. Creating is [`create`], removing is [`remove`]; this file finds and reports.

mod create;
mod project_lock;
mod remove;

use std::path::{Path, PathBuf};

use git2::Repository;

use crate::error::ViewError;
use crate::events::WatchEvent;
use crate::lock::{self, default_runtime_dir};
use crate::meta;
use crate::names;
use crate::repo::{self, Project};
use crate::status::{self, SyncState, ViewStatus, WatcherState};
use crate::view::View;
use crate::watcher::{WatchOptions, Watcher, WatcherHandle};

pub use create::{CreateOutcome, Created};
pub use remove::Removed;

/// Creates, finds and removes the views under one views root.
#[derive(Debug, Clone)]
pub struct ViewManager {
    root: PathBuf,
    runtime_dir: PathBuf,
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
