//! Sandbox views against real repositories, real `git` commits and real inotify events.
//! One test binary (`--test view`) so the views' and the watcher's tests run together.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod lifecycle;
mod watcher;
