//! Files in the worktree that tools on the host run or load when the project is opened: the
//! user's Claude Code, editor, direnv and git read them as configuration that names commands,
//! so a run that writes one runs its code on the host at the user's next step (opening the
//! folder, starting the agent, `cd`, `git checkout`). They are read-only inside unless a write
//! grant opens them (`--allow-write .vscode`); the native view binds each that exists read-only
//! over itself, and after every run the host sets aside what the run created at one and puts
//! back what it changed (docs/security.md, "Files host tools run").
//!
//! The list is data, like the domain groups: each entry names the tool and what it runs. Only
//! what a tool runs or loads as code or as configuration naming commands is here — a prompt
//! file (`CLAUDE.md`) or a lockfile is not.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One path (relative to the worktree root) that a host tool runs or loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFileRule {
    /// Relative to the worktree root, `/`-separated.
    pub path: &'static str,
    /// Why it is protected: the tool, and what it runs from there.
    pub why: &'static str,
}

/// The protected paths.
pub const HOST_FILES: &[HostFileRule] = &[
    HostFileRule {
        path: ".claude/settings.json",
        why: "Claude Code runs its hooks, statusLine and apiKeyHelper commands",
    },
    HostFileRule {
        path: ".claude/settings.local.json",
        why: "Claude Code runs its hooks and statusLine commands (git-ignored: no diff shows it)",
    },
    HostFileRule {
        path: ".claude/commands",
        why: "Claude Code loads its slash commands (their `!` lines run shell commands)",
    },
    HostFileRule {
        path: ".claude/agents",
        why: "Claude Code loads its subagents (their prompts and allowed tools)",
    },
    HostFileRule {
        path: ".claude/hooks",
        why: "Claude Code's hooks run the scripts kept here",
    },
    HostFileRule {
        path: ".claude/skills",
        why: "Claude Code loads its skills (instructions and the scripts they run)",
    },
    HostFileRule {
        path: ".mcp.json",
        why: "Claude Code starts the MCP servers it names (commands run on the host)",
    },
    HostFileRule {
        path: ".vscode",
        why: "VS Code runs tasks.json's folder-open tasks and reads settings naming programs",
    },
    HostFileRule {
        path: ".idea",
        why: "JetBrains IDEs load its run configurations, external tools and startup tasks",
    },
    HostFileRule {
        path: ".devcontainer",
        why: "VS Code Dev Containers runs its initializeCommand on the host",
    },
    HostFileRule {
        path: ".envrc",
        why: "direnv sources it as shell code when you enter the folder",
    },
    HostFileRule {
        path: ".gitmodules",
        why: "git clones and checks out the repositories it names (submodule update)",
    },
    HostFileRule {
        path: ".gitattributes",
        why: "git runs the filter, diff and merge drivers it names (checkout, add, diff)",
    },
    HostFileRule {
        path: ".pre-commit-config.yaml",
        why: "pre-commit, from git's pre-commit hook, runs the commands it names",
    },
];

/// One protected path of a run's worktree, and whether a grant opened it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFile {
    /// Absolute (the worktree root joined with [`HostFileRule::path`]).
    pub path: PathBuf,
    /// As listed, relative to the worktree root (`.vscode`): what the grant names.
    pub name: String,
    pub why: String,
    /// The write grant that opens it (`--allow-write` of it or of a directory holding it
    /// inside the worktree): writable, and not checked after the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<PathBuf>,
}

impl HostFile {
    /// The flag that would open it, as the user would type it from the worktree root.
    pub fn grant_flag(&self) -> String {
        format!("--allow-write {}", self.name)
    }
}

/// The protected paths of the worktree at `root`, each opened by the first of `grants` that
/// is the path itself or a directory holding it strictly inside `root` (a grant of the
/// worktree or of a directory above it opens nothing: it is the default grant).
pub fn host_files(root: &Path, grants: &[&Path]) -> Vec<HostFile> {
    HOST_FILES
        .iter()
        .map(|rule| {
            let path = root.join(rule.path);
            let granted = grants
                .iter()
                .find(|g| g.starts_with(root) && **g != root && path.starts_with(g))
                .map(|g| g.to_path_buf());
            HostFile {
                path,
                name: rule.path.to_string(),
                why: rule.why.to_string(),
                granted,
            }
        })
        .collect()
}

/// Whether `path` (absolute, not necessarily existing) is a protected path of `root` or lies
/// in one: a write grant of it is accepted even when it does not exist yet (`--allow-write
/// .mcp.json` before the run creates it).
pub fn is_host_file(root: &Path, path: &Path) -> bool {
    HOST_FILES
        .iter()
        .any(|rule| path.starts_with(root.join(rule.path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_relative_and_says_which_tool() {
        for rule in HOST_FILES {
            assert!(!rule.path.starts_with('/') && !rule.path.contains(".."));
            assert!(!rule.why.is_empty(), "{}", rule.path);
        }
        let names: Vec<_> = HOST_FILES.iter().map(|r| r.path).collect();
        for needed in [".claude/settings.json", ".mcp.json", ".vscode", ".envrc"] {
            assert!(names.contains(&needed), "{needed}");
        }
    }

    #[test]
    fn a_grant_inside_the_worktree_opens_what_it_holds_and_the_worktree_grant_nothing() {
        let root = Path::new("/w/task");
        let files = host_files(
            root,
            &[
                root,
                Path::new("/w"),
                Path::new("/w/task/.vscode"),
                Path::new("/w/task/.claude"),
            ],
        );
        let granted = |name: &str| {
            files
                .iter()
                .find(|f| f.name == name)
                .unwrap()
                .granted
                .clone()
        };
        assert_eq!(granted(".vscode"), Some("/w/task/.vscode".into()));
        assert_eq!(granted(".claude/commands"), Some("/w/task/.claude".into()));
        assert_eq!(granted(".mcp.json"), None);
        assert_eq!(granted(".envrc"), None);
        assert!(is_host_file(root, Path::new("/w/task/.vscode/tasks.json")));
        assert!(!is_host_file(root, Path::new("/w/task/src/.vscode")));
        let vscode = files.iter().find(|f| f.name == ".vscode").unwrap();
        assert_eq!(vscode.grant_flag(), "--allow-write .vscode");
    }
}
