//! What happens after a command's processes are gone, and what makes it happen even when
//! the supervisor was killed first:
//!
//! * `gitguard`: the git pointer files and the worktree's own git dir checked and restored;
//! * `hostfiles`: the files host tools run (`.claude/settings.json`, `.mcp.json`, `.vscode`…)
//!   put back as they were, what the run created there set aside;
//! * `journal`: the record of every command whose after-run checks are still to come, done
//!   at the next start when a killed supervisor never did them.
//!
//! The order (reap, then finish) is [`crate::run`]'s; the finish itself is the seam's
//! (`PreparedCommand::finish`).

pub(crate) mod gitguard;
pub(crate) mod hostfiles;
pub(crate) mod journal;
