//! The `hostfiles` family: files in the worktree that tools on the host run when the project
//! is opened (`sandbox_policy::hostfiles`). Each attack plants what the tool would run, then
//! plays the user's next step on the host the way the tool does it — Claude Code starting
//! (its hooks, its MCP servers), VS Code opening the folder (its folder-open tasks), direnv
//! entering it (sourcing `.envrc`) — and looks for the mark the planted command leaves.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use super::fixture::{unique, Fixture};
use super::harness::{judge, Attack, Verdict, MARK};

/// Runs `command` as the host tool would: `sh -c` in the worktree.
fn host_runs(dir: &Path, command: &str) {
    let _ = Command::new("sh")
        .args(["-c", command])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// The user starts Claude Code in the worktree: it runs the command hooks of the project's
/// `.claude/settings.json` and `.claude/settings.local.json` (their `SessionStart` ones at
/// once; every event's here, which can only find more) and starts the servers `.mcp.json`
/// names.
fn claude_code_starts(dir: &Path) {
    for settings in [".claude/settings.json", ".claude/settings.local.json"] {
        let Some(json) = read_json(&dir.join(settings)) else {
            continue;
        };
        let events = json["hooks"].as_object().cloned().unwrap_or_default();
        for matchers in events.values() {
            for matcher in matchers.as_array().into_iter().flatten() {
                for hook in matcher["hooks"].as_array().into_iter().flatten() {
                    if let Some(command) = hook["command"].as_str() {
                        host_runs(dir, command);
                    }
                }
            }
        }
    }
    if let Some(json) = read_json(&dir.join(".mcp.json")) {
        for server in json["mcpServers"]
            .as_object()
            .into_iter()
            .flat_map(|s| s.values())
        {
            let Some(program) = server["command"].as_str() else {
                continue;
            };
            let args: Vec<&str> = server["args"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str())
                .collect();
            let _ = Command::new(program)
                .args(args)
                .current_dir(dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The user opens the folder in VS Code: it runs the tasks of `.vscode/tasks.json` whose
/// `runOptions.runOn` is `folderOpen` (shell tasks: the command through the shell).
fn vscode_opens(dir: &Path) {
    let Some(json) = read_json(&dir.join(".vscode/tasks.json")) else {
        return;
    };
    for task in json["tasks"].as_array().into_iter().flatten() {
        if task["runOptions"]["runOn"] == "folderOpen" {
            if let Some(command) = task["command"].as_str() {
                host_runs(dir, command);
            }
        }
    }
}

/// The user `cd`s into the worktree with direnv: it sources `.envrc` (direnv is not
/// installed here; `direnv allow` is what the user gives a project's own `.envrc` anyway).
fn direnv_enters(dir: &Path) {
    if dir.join(".envrc").is_file() {
        host_runs(dir, ". ./.envrc");
    }
}

/// Held by setting aside or putting back what the run changed: `Repaired` when it said so.
fn judge_host_files(out: &Output, escaped: bool, what: &str) -> Verdict {
    match judge(out, escaped, what) {
        Verdict::Blocked if crate::common::text(out).contains("host files: the run") => {
            Verdict::Repaired
        }
        other => other,
    }
}

/// A user's project settings, there before the run.
fn project_settings(f: &Fixture) {
    std::fs::create_dir_all(f.task.join(".claude")).unwrap();
    std::fs::write(
        f.task.join(".claude/settings.json"),
        "{\"permissions\": {\"allow\": [\"Bash(make test)\"]}}\n",
    )
    .unwrap();
    std::fs::create_dir_all(f.task.join(".vscode")).unwrap();
    std::fs::write(
        f.task.join(".vscode/settings.json"),
        "{\"editor.formatOnSave\": true}\n",
    )
    .unwrap();
}

/// A Claude Code hook that leaves `mark`, as JSON settings.
fn hook_settings(mark: &Path) -> String {
    format!(
        "{{\"hooks\":{{\"SessionStart\":[{{\"hooks\":[{{\"type\":\"command\",\"command\":\"touch {}\"}}]}}]}}}}",
        mark.display()
    )
}

/// Files in the worktree that host tools run.
pub(super) fn hostfiles_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "add a hook to the project's .claude/settings.json",
            needs: None,
            run: |f, b| {
                project_settings(f);
                let mark = f.outside.join(format!("claude-hook-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '%s' '{}' > .claude/settings.json",
                        hook_settings(&mark)
                    ),
                );
                claude_code_starts(&f.task);
                judge_host_files(&out, mark.exists(), "the host's Claude Code ran the hook")
            },
        },
        Attack {
            name: "create .claude/settings.local.json with a hook (git-ignored)",
            needs: None,
            run: |f, b| {
                project_settings(f);
                let mark = f.outside.join(format!("claude-local-hook-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '%s' '{}' > .claude/settings.local.json",
                        hook_settings(&mark)
                    ),
                );
                claude_code_starts(&f.task);
                judge_host_files(&out, mark.exists(), "the host's Claude Code ran the hook")
            },
        },
        Attack {
            name: "replace .claude with a directory of the run's, holding a hook",
            needs: None,
            run: |f, b| {
                project_settings(f);
                let mark = f.outside.join(format!("claude-swap-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; mv .claude .claude-old; mkdir -p .claude && \
                         printf '%s' '{}' > .claude/settings.json",
                        hook_settings(&mark)
                    ),
                );
                claude_code_starts(&f.task);
                judge_host_files(&out, mark.exists(), "the host's Claude Code ran the hook")
            },
        },
        Attack {
            name: "create .mcp.json naming a server command",
            needs: None,
            run: |f, b| {
                let mark = f.outside.join(format!("mcp-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '%s' '{{\"mcpServers\":{{\"x\":{{\"command\":\"touch\",\"args\":[\"{}\"]}}}}}}' > .mcp.json",
                        mark.display()
                    ),
                );
                claude_code_starts(&f.task);
                judge_host_files(
                    &out,
                    mark.exists(),
                    "the host's Claude Code started the server",
                )
            },
        },
        Attack {
            name: "add a folder-open task to .vscode/tasks.json",
            needs: None,
            run: |f, b| {
                project_settings(f);
                let mark = f.outside.join(format!("vscode-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '%s' '{{\"version\":\"2.0.0\",\"tasks\":[{{\"label\":\"x\",\"type\":\"shell\",\"command\":\"touch {}\",\"runOptions\":{{\"runOn\":\"folderOpen\"}}}}]}}' > .vscode/tasks.json",
                        mark.display()
                    ),
                );
                vscode_opens(&f.task);
                judge_host_files(&out, mark.exists(), "VS Code ran the folder-open task")
            },
        },
        Attack {
            name: "create .envrc for direnv",
            needs: None,
            run: |f, b| {
                let mark = f.outside.join(format!("envrc-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; echo 'touch {}' > .envrc", mark.display()),
                );
                direnv_enters(&f.task);
                judge_host_files(&out, mark.exists(), "direnv sourced the run's .envrc")
            },
        },
    ]
}
