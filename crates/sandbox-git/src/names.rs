//! Names: which task, branch and project names are usable, and the paths and branch names
//! derived from them.
//!
//! A task name becomes a directory (`<task>-sandbox`) inside the views root, a worktree name
//! in `<common>/worktrees/`, and a lock file name; a branch name becomes `s/<branch>`. So a
//! task name must be one path component *and* a valid git ref component, and a branch must
//! be a valid branch whose child `s/<branch>` is valid too.

use std::path::{Component, Path, PathBuf};

use crate::error::ViewError;

/// The prefix of a view's child branch: the view of `<b>` is on `s/<b>`.
pub const CHILD_PREFIX: &str = "s/";

/// Suffix of a view's directory and worktree name: `<task>-sandbox`.
pub const VIEW_SUFFIX: &str = "-sandbox";

/// Longest accepted task name, in bytes: leaves room for the suffixes within NAME_MAX (255).
pub const MAX_TASK_LEN: usize = 100;

fn invalid(kind: &'static str, name: &str, reason: impl Into<String>, hint: &str) -> ViewError {
    ViewError::InvalidName {
        kind,
        name: name.to_string(),
        reason: reason.into(),
        hint: if hint.is_empty() {
            String::new()
        } else {
            format!("; {hint}")
        },
    }
}

/// Checks a task name: one path component, a valid git ref component, not an option.
pub fn validate_task(name: &str) -> Result<(), ViewError> {
    const HINT: &str = "pass a simple name such as T-12 or fix-login with --task";
    let bad = |reason: &str| Err(invalid("task name", name, reason, HINT));
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_TASK_LEN {
        return bad(&format!("it is longer than {MAX_TASK_LEN} bytes"));
    }
    if name == "." || name == ".." {
        return bad("it would place the view outside the views root");
    }
    if name.contains('/') || name.contains('\\') {
        return bad("it must be a single name, not a path (it names the directory <task>-sandbox inside the views root)");
    }
    if name.starts_with('-') {
        return bad("it must not start with '-' (it would read as an option)");
    }
    if name == "@" {
        return bad("'@' means HEAD to git");
    }
    if !git2::Reference::is_valid_name(&format!("refs/heads/{name}")) {
        return bad("it is not a valid git ref name (no spaces, control characters, '..', '~^:?*[\\', '@{', leading '.' or trailing '.lock')");
    }
    Ok(())
}

/// Checks a branch name (without `refs/heads/`) and that its child `s/<branch>` is valid.
pub fn validate_branch(name: &str) -> Result<(), ViewError> {
    let bad = |reason: &str| {
        Err(invalid(
            "branch name",
            name,
            reason,
            "rename the branch (git branch -m <new name>)",
        ))
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.starts_with('-') {
        return bad("it must not start with '-' (it would read as an option)");
    }
    if name == "HEAD" || name == "@" {
        return bad("it names HEAD, not a branch");
    }
    if !git2::Reference::is_valid_name(&format!("refs/heads/{name}")) {
        return bad("it is not a valid git branch name");
    }
    if !git2::Reference::is_valid_name(&format!("refs/heads/{CHILD_PREFIX}{name}")) {
        return bad("its child branch s/<branch> would not be a valid git branch name");
    }
    Ok(())
}

/// Checks a project name (the main worktree's directory name). Spaces are allowed: this is a
/// directory name, never a ref.
pub fn validate_project(name: &str) -> Result<(), ViewError> {
    let bad = |reason: &str| {
        Err(invalid(
            "project name",
            name,
            reason,
            "the project name is the repository directory's name; rename or move the repository",
        ))
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name == "." || name == ".." {
        return bad("it would place views outside the views root");
    }
    if name.contains('/') || name.contains('\\') || name.contains('\0') {
        return bad("it must be a single directory name");
    }
    if name.len() > 200 {
        return bad("it is longer than 200 bytes");
    }
    Ok(())
}

/// `s/<branch>`.
pub fn child_branch(branch: &str) -> Result<String, ViewError> {
    validate_branch(branch)?;
    Ok(format!("{CHILD_PREFIX}{branch}"))
}

/// The name of the view's worktree in `<common>/worktrees/` (and of its directory).
pub fn worktree_name(task: &str) -> String {
    format!("{task}{VIEW_SUFFIX}")
}

/// `<root>/<project>/<task>-sandbox`, after checking that it lies exactly two levels below
/// `root` (belt and braces: the validations above already guarantee it).
pub fn view_path(root: &Path, project: &str, task: &str) -> Result<PathBuf, ViewError> {
    validate_project(project)?;
    validate_task(task)?;
    let path = root.join(project).join(worktree_name(task));
    let rest = path.strip_prefix(root).ok();
    let two_normal = rest.is_some_and(|r| {
        let comps: Vec<_> = r.components().collect();
        comps.len() == 2 && comps.iter().all(|c| matches!(c, Component::Normal(_)))
    });
    if !two_normal {
        return Err(ViewError::OutsideViewsRoot {
            path,
            root: root.to_path_buf(),
        });
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_task_names() {
        for n in ["T-1", "fix-login", "task_2", "a.b", "UPPER", "ü"] {
            validate_task(n).unwrap_or_else(|e| panic!("{n}: {e}"));
        }
    }

    #[test]
    fn bad_task_names() {
        for n in [
            "", ".", "..", "../x", "a/b", "/abs", "a b", "-rf", "x.lock", ".hidden", "a..b", "a~1",
            "a^", "a:b", "a?", "a*", "a[", "a\\b", "@", "a@{1", "end.", "tab\t", "nl\n",
        ] {
            let err = validate_task(n).expect_err(n);
            let msg = err.to_string();
            assert!(msg.starts_with("invalid task name"), "{msg}");
            assert!(msg.contains("--task"), "{msg}");
        }
        assert!(validate_task(&"x".repeat(MAX_TASK_LEN + 1)).is_err());
    }

    #[test]
    fn branch_names() {
        for b in ["main", "feature/x", "user/topic/deep", "v1.2"] {
            validate_branch(b).unwrap_or_else(|e| panic!("{b}: {e}"));
            assert_eq!(child_branch(b).unwrap(), format!("s/{b}"));
        }
        for b in [
            "", "-x", "a..b", "a b", "x.lock", "HEAD", "a/", "/a", "a//b",
        ] {
            let msg = validate_branch(b).expect_err(b).to_string();
            assert!(msg.starts_with("invalid branch name"), "{msg}");
        }
    }

    #[test]
    fn project_names_allow_spaces_but_not_paths() {
        validate_project("My Project").unwrap();
        validate_project(".dotfiles").unwrap();
        for p in ["", ".", "..", "a/b"] {
            assert!(validate_project(p).is_err(), "{p}");
        }
    }

    #[test]
    fn view_path_is_two_levels_below_root() {
        let root = Path::new("/v");
        assert_eq!(
            view_path(root, "app", "T-1").unwrap(),
            PathBuf::from("/v/app/T-1-sandbox")
        );
        assert!(view_path(root, "..", "T-1").is_err());
        assert!(view_path(root, "app", "../../etc").is_err());
    }
}
