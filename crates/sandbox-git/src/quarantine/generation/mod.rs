//! Commits from a box (a VM guest): per busy period a private *generation* of the common dir
//! that the guest writes, read back by the host's quarantine when the period ends.
//!
//! A guest cannot stack the native backend's overlay on the common dir, so the host lays out
//! a copy instead ([`Generation::begin`]): refs and `packed-refs` copied, the objects
//! borrowed from the repository through `objects/info/alternates` (read-only in the box),
//! `hooks` and `info` as links into the read-only common dir, `config` and `HEAD` copied, and
//! the worktree's admin dir (`worktrees/<name>`, with a copy of the index). It is renamed into
//! the box's writable directory as `gen-<random>`, and the `current` link there points at it;
//! inside the box the worktree's `.git` is a read-only file saying
//! `gitdir: <writable>/current/worktrees/<name>` ([`BoxGit::pointer`]).
//!
//! When the period ends ([`Generation::end`]) the generation is renamed out of the guest's
//! reach (and refused unless it is still a directory), held by a descriptor, and read back
//! as the native quarantine reads its layer: objects taken in by content, refs judged (the
//! task branch moves, other refs stay), `HEAD` by [`super::refs::head_allowed`], the index
//! copied back; then it is removed. Nothing else the guest wrote there — a hook, a config, a
//! link — is ever read by the host.
//!
//! A daemon that dies mid-period (SIGKILL, a crash) cannot read its generation back. So
//! before a generation is laid out, the host writes a record of it beside the box's git
//! directories (`<root>/records/<name>.json`, never mounted in the box): the repository, the
//! worktree, every ref as the generation starts with it, `HEAD` and the index's identity. The
//! record stays locked (`flock`) by the daemon for the period; the kernel drops the lock when
//! the daemon dies, however it dies. The next daemon's [`recover`] reads back every generation
//! whose record is unlocked as [`Generation::end`] would have — objects by content, refs
//! judged against the recorded start, `HEAD` when allowed, the index only if the worktree's is
//! still the one the generation copied — reports it, and removes it and its record. A
//! generation with no record (laid out by an older version) is reported and removed unread.

mod box_git;
mod files;
mod period;
mod read_back;
mod record;
mod recover;
#[cfg(test)]
mod tests;

pub use box_git::BoxGit;
pub use period::Generation;
pub use read_back::GenerationEnd;
pub use recover::{recover, Recovered};
