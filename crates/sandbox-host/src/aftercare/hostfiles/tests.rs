//! The after-run check of the files host tools run, against a real directory: each test
//! changes what a run could and looks at what the host would open next.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::*;

fn policy(root: &Path, grants: &[&str]) -> Policy {
    sandbox_policy::build(sandbox_policy::PolicyRequest {
        workdir: root.to_path_buf(),
        system_read: Some(vec![]),
        devices: Some(vec![]),
        allow_write: grants
            .iter()
            .map(|g| (root.join(g), sandbox_policy::GrantReason::User))
            .collect(),
        ..Default::default()
    })
    .unwrap()
}

fn project() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    fs::create_dir_all(root.join(".vscode")).unwrap();
    fs::write(
        root.join(".vscode/settings.json"),
        "{\"editor.tabSize\": 4}\n",
    )
    .unwrap();
    fs::create_dir_all(root.join(".claude")).unwrap();
    fs::write(
        root.join(".claude/settings.json"),
        "{\"permissions\": {}}\n",
    )
    .unwrap();
    fs::write(root.join(".envrc"), "use flake\n").unwrap();
    fs::set_permissions(root.join(".envrc"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::write(root.join("main.rs"), "fn main() {}\n").unwrap();
    (dir, root)
}

fn asides(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".sandbox-set-aside-"))
        .collect();
    names.sort();
    names
}

#[test]
fn what_the_run_created_is_set_aside_and_named_with_its_grant() {
    let (_d, root) = project();
    let start = HostFilesAtStart::scan(&policy(&root, &[])).unwrap();
    fs::write(
        root.join(".mcp.json"),
        "{\"mcpServers\":{\"x\":{\"command\":\"sh\"}}}",
    )
    .unwrap();
    fs::write(
        root.join(".vscode/tasks.json"),
        "{\"runOn\": \"folderOpen\"}",
    )
    .unwrap();
    fs::write(root.join("main.rs"), "fn main() { changed() }\n").unwrap();
    let report = audit_host_files(&start);
    assert_eq!(report.changes.len(), 2, "{report:?}");
    assert!(!root.join(".mcp.json").exists());
    assert!(!root.join(".vscode/tasks.json").exists());
    let aside = asides(&root);
    assert_eq!(aside.len(), 2, "{aside:?}");
    assert!(
        aside[1].starts_with(".vscode%tasks.json.sandbox-set-aside-"),
        "{aside:?}"
    );
    assert!(
        asides(&root.join(".vscode")).is_empty(),
        "nothing left where VS Code looks"
    );
    let lines = report.warnings().join("\n");
    assert!(lines.contains("--allow-write .mcp.json"), "{lines}");
    assert!(lines.contains("--allow-write .vscode"), "{lines}");
    assert!(lines.contains("Claude Code"), "{lines}");
    // The work itself is the run's.
    assert_eq!(
        fs::read_to_string(root.join("main.rs")).unwrap(),
        "fn main() { changed() }\n"
    );
    assert_eq!(
        audit_host_files(&start),
        HostFilesReport::default(),
        "done once"
    );
}

#[test]
fn what_the_run_changed_or_removed_is_put_back_as_it_was() {
    let (_d, root) = project();
    let start = HostFilesAtStart::scan(&policy(&root, &[])).unwrap();
    let hook =
        "{\"hooks\":{\"SessionStart\":[{\"hooks\":[{\"type\":\"command\",\"command\":\"x\"}]}]}}";
    fs::write(root.join(".claude/settings.json"), hook).unwrap();
    fs::remove_file(root.join(".envrc")).unwrap();
    fs::remove_dir_all(root.join(".vscode")).unwrap();
    let report = audit_host_files(&start);
    assert!(report.changes.iter().all(|c| c.restored), "{report:?}");
    assert_eq!(
        fs::read_to_string(root.join(".claude/settings.json")).unwrap(),
        "{\"permissions\": {}}\n"
    );
    let envrc = root.join(".envrc");
    assert_eq!(fs::read_to_string(&envrc).unwrap(), "use flake\n");
    assert_eq!(
        fs::metadata(&envrc).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(
        fs::read_to_string(root.join(".vscode/settings.json")).unwrap(),
        "{\"editor.tabSize\": 4}\n"
    );
    let aside = asides(&root);
    assert_eq!(aside.len(), 1, "the run's version is kept: {aside:?}");
    let kept = fs::read_to_string(root.join(&aside[0])).unwrap();
    assert_eq!(kept, hook);
}

#[test]
fn a_link_put_where_a_directory_on_the_way_was_is_set_aside() {
    let (_d, root) = project();
    let elsewhere = tempfile::tempdir().unwrap();
    fs::write(elsewhere.path().join("settings.json"), "{\"hooks\":{}}").unwrap();
    let start = HostFilesAtStart::scan(&policy(&root, &[])).unwrap();
    fs::rename(root.join(".claude"), root.join("claude-old")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), root.join(".claude")).unwrap();
    let report = audit_host_files(&start);
    assert!(
        root.join(".claude").symlink_metadata().is_err()
            || root.join(".claude").symlink_metadata().unwrap().is_dir(),
        "no link left at .claude: {report:?}"
    );
    assert!(!root.join(".claude").is_symlink());
    assert_eq!(
        fs::read_to_string(root.join(".claude/settings.json")).unwrap(),
        "{\"permissions\": {}}\n",
        "{report:?}"
    );
    assert_eq!(
        fs::read_to_string(elsewhere.path().join("settings.json")).unwrap(),
        "{\"hooks\":{}}",
        "nothing followed through the link"
    );
}

#[test]
fn a_grant_opens_its_path_and_nothing_else() {
    let (_d, root) = project();
    fs::write(root.join(".vscode/launch.json"), "{}").unwrap();
    let start = HostFilesAtStart::scan(&policy(&root, &[".vscode", ".mcp.json"])).unwrap();
    fs::write(root.join(".vscode/tasks.json"), "{}").unwrap();
    fs::write(root.join(".mcp.json"), "{}").unwrap();
    fs::write(root.join(".envrc"), "curl x | sh\n").unwrap();
    let report = audit_host_files(&start);
    assert!(root.join(".vscode/tasks.json").exists());
    assert!(
        root.join(".mcp.json").exists(),
        "a missing path may be granted"
    );
    assert_eq!(report.changes.len(), 1, "{report:?}");
    assert_eq!(report.changes[0].listed, ".envrc");
    assert_eq!(
        fs::read_to_string(root.join(".envrc")).unwrap(),
        "use flake\n"
    );
}

#[test]
fn a_file_too_large_to_keep_is_set_aside_and_said_not_restored() {
    let (_d, root) = project();
    let big = vec![b'x'; FILE_CAP as usize + 1];
    fs::write(root.join(".gitattributes"), &big).unwrap();
    let start = HostFilesAtStart::scan(&policy(&root, &[])).unwrap();
    fs::write(root.join(".gitattributes"), "* filter=evil\n").unwrap();
    let report = audit_host_files(&start);
    assert_eq!(report.changes.len(), 1, "{report:?}");
    let change = &report.changes[0];
    assert!(!change.restored && change.moved_to.is_some(), "{change:?}");
    assert!(!root.join(".gitattributes").exists());
    assert!(report.warnings()[0].contains("too large"), "{report:?}");
}

#[test]
fn a_link_the_project_had_on_the_way_is_left_alone() {
    let (_d, root) = project();
    let shared = tempfile::tempdir().unwrap();
    fs::write(shared.path().join("settings.json"), "{}").unwrap();
    fs::remove_dir_all(root.join(".claude")).unwrap();
    std::os::unix::fs::symlink(shared.path(), root.join(".claude")).unwrap();
    let start = HostFilesAtStart::scan(&policy(&root, &[])).unwrap();
    assert_eq!(audit_host_files(&start), HostFilesReport::default());
    assert!(root.join(".claude").is_symlink(), "the user's link stays");
}
