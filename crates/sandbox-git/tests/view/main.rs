//! Sandbox views against real repositories, real `git` commits and real inotify events.
//! One test binary (`--test view`) so the views' and the watcher's tests run together.

mod common;
mod lifecycle;
mod watcher;
