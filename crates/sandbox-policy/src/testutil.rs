//! A hand-built policy for the compilers' unit tests: no filesystem access, so the tests run
//! the same on every OS.

use std::path::PathBuf;

use crate::model::*;
use crate::EnvPolicy;

pub fn linked_policy(block: bool) -> Policy {
    let common = PathBuf::from("/repo/.git");
    let gitdir = common.join("worktrees/task");
    Policy {
        workspace: Workspace {
            root: "/work/task".into(),
            cwd: "/work/task".into(),
            git: Some(GitLayout {
                is_linked: true,
                common_dir: common.clone(),
                worktree_gitdir: gitdir.clone(),
                worktree_config: false,
                pointers: vec![PointerFile {
                    path: "/work/task/.git".into(),
                    content: "gitdir: /repo/.git/worktrees/task\n".into(),
                }],
                task_branch: Some("refs/heads/task".into()),
                hooks_path: None,
                push_remotes: Vec::new(),
                absent_pointers: Vec::new(),
                allow_nested_git: false,
            }),
            host_files: Vec::new(),
        },
        fs: FsPolicy {
            read: vec![Grant {
                path: common.clone(),
                reason: GrantReason::GitReadOnly,
            }],
            write: vec![
                Grant {
                    path: "/work/task".into(),
                    reason: GrantReason::Worktree,
                },
                Grant {
                    path: common.join("objects"),
                    reason: GrantReason::GitData,
                },
                Grant {
                    path: gitdir,
                    reason: GrantReason::GitData,
                },
            ],
            system_read: vec!["/usr".into(), "/etc".into()],
            devices: vec!["/dev/null".into()],
            tmpdir: None,
            copies: vec![],
            home: None,
        },
        net: if block {
            NetPolicy::Block {
                allow_tcp_ports: vec![3000],
            }
        } else {
            NetPolicy::Allow
        },
        env: EnvPolicy::default(),
        limits: Limits::default(),
        hook_port: Some(7465),
        allow_domains: vec![],
        credentials: vec![],
        publish: vec![],
        unprotected_git: false,
        agent: None,
    }
}
