//! Sandbox views and the fast-forward watcher.
//!
//! A VM backend (Lima, BoxLite) never mounts the user's task worktree. It mounts a *sandbox
//! view*: a second linked worktree of the same repository, at
//! `<views root>/<project>/<task>-sandbox`, on the child branch `s/<branch>`. Because it is a
//! plain worktree checkout, only tracked files exist there — no `.env`, no `node_modules`, no
//! build caches, nothing ignored or untracked.
//!
//! When the agent commits inside the VM, the commit lands on `s/<branch>`. The [`Watcher`]
//! (event-driven with `notify`) fast-forwards `<branch>` to it, and updates the task worktree
//! that has `<branch>` checked out the way `git merge --ff-only` would. It never forces
//! anything: a branch the user moved in parallel is reported as diverged, a task worktree with
//! uncommitted changes in the touched files is reported as blocked, and in both cases nothing
//! is moved.
//!
//! ```no_run
//! use sandbox_git::{ViewManager, WatchEvent};
//! # fn main() -> Result<(), sandbox_git::ViewError> {
//! let views = ViewManager::new("/home/me/.local/share/sandbox/views")
//!     .with_runtime_dir("/run/user/1000/sandbox");
//! let created = views.create_or_reuse("/home/me/work/app-task1".as_ref(), None)?;
//! for mount in created.view.vm_mounts() {
//!     println!("{} {}", if mount.writable { "rw" } else { "ro" }, mount.host_path.display());
//! }
//! let _watcher = views.watch(vec![created.view], |event: WatchEvent| eprintln!("{}", event.describe()))?;
//! // … the watcher runs until `_watcher` is dropped.
//! # Ok(()) }
//! ```
//!
//! Modules: [`names`] validates task and branch names, `view` is the view itself, `manager`
//! creates/lists/removes views, [`mounts`] is the VM mount data, `fastforward` moves one
//! branch safely, `watcher` reacts to ref changes, [`events`] is what the watcher reports;
//! `sys` holds the few raw system calls (the quarantine's), each behind a safe wrapper.

mod error;
pub mod events;
mod fastforward;
mod lock;
mod manager;
mod meta;
pub mod mounts;
pub mod names;
pub mod quarantine;
mod repo;
mod status;
#[cfg(target_os = "linux")]
mod sys;
mod util;
mod view;
mod watcher;

pub use error::ViewError;
pub use events::{BlockReason, WatchEvent};
pub use manager::{CreateOutcome, Created, Removed, ViewManager};
pub use mounts::{Mount, MountPurpose};
pub use repo::Project;
pub use status::{SyncState, ViewStatus, WatcherState};
pub use view::View;
pub use watcher::{WatchOptions, Watcher, WatcherHandle};
