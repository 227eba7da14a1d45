//! View metadata: one JSON file per view, next to the view's directory
//! (`<root>/<project>/<task>-sandbox.json`). It lives outside the view, so nothing inside a VM
//! can edit it, and it lets `list`/`status`/`remove` find views from any directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ViewError;
use crate::names;
use crate::util::write_atomic;
use crate::view::View;

const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct Record {
    version: u32,
    created_unix_ms: u64,
    #[serde(flatten)]
    view: View,
}

pub(crate) fn path_for(root: &Path, project: &str, task: &str) -> PathBuf {
    root.join(project)
        .join(format!("{}.json", names::worktree_name(task)))
}

pub(crate) fn write(root: &Path, view: &View) -> Result<(), ViewError> {
    let record = Record {
        version: VERSION,
        created_unix_ms: crate::util::now_unix_ms(),
        view: view.clone(),
    };
    let path = path_for(root, &view.project, &view.task);
    let mut text = serde_json::to_vec_pretty(&record)
        .map_err(|e| ViewError::io("cannot serialise the view record", &path)(e.into()))?;
    text.push(b'\n');
    write_atomic(&path, &text)
}

/// Reads one record. `Ok(None)` if there is none. The record is checked against the views
/// root: a record that names a path elsewhere is refused, not followed.
pub(crate) fn read(root: &Path, project: &str, task: &str) -> Result<Option<View>, ViewError> {
    let path = path_for(root, project, task);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ViewError::io("cannot read", &path)(e)),
    };
    let bad = |message: String| ViewError::Metadata {
        path: path.clone(),
        message,
    };
    let record: Record =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not a view record: {e}")))?;
    if record.version != VERSION {
        return Err(bad(format!(
            "format version {} (this sandbox reads version {VERSION})",
            record.version
        )));
    }
    let view = record.view;
    names::validate_task(&view.task)?;
    names::validate_branch(&view.branch)?;
    let expected = names::view_path(root, project, task)?;
    if view.task != task || view.project != project || view.view_path != expected {
        return Err(bad(format!(
            "it records task {:?} of project {:?} at {}, expected {}",
            view.task,
            view.project,
            view.view_path.display(),
            expected.display()
        )));
    }
    if view.child_branch != names::child_branch(&view.branch)?
        || view.worktree_name != names::worktree_name(&view.task)
    {
        return Err(bad(
            "its branch or worktree names do not match its task".into()
        ));
    }
    Ok(Some(view))
}

pub(crate) fn remove(root: &Path, project: &str, task: &str) -> Result<(), ViewError> {
    let path = path_for(root, project, task);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ViewError::io("cannot remove", &path)(e)),
    }
}

/// The tasks that have a record in `<root>/<project>/`, sorted.
pub(crate) fn tasks(root: &Path, project: &str) -> Result<Vec<String>, ViewError> {
    let dir = root.join(project);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ViewError::io("cannot list", &dir)(e)),
    };
    let suffix = format!("{}.json", names::VIEW_SUFFIX);
    let mut out: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let task = name.strip_suffix(&suffix)?.to_string();
            names::validate_task(&task).ok().map(|_| task)
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The project directories under the views root, sorted.
pub(crate) fn projects(root: &Path) -> Result<Vec<String>, ViewError> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ViewError::io("cannot list", root)(e)),
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| names::validate_project(n).is_ok())
        .collect();
    out.sort();
    Ok(out)
}
